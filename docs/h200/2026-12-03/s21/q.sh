#!/usr/bin/env bash
# Call 2 of the twenty-first session's second machine (after staging; carry .stage2 and .ab):
# the few-row quantized kernel's copy that carries its sources from k-tile to k-tile (this
# tree) against the one before it (arm .ab/base = b2c7b64's bi_rl/ and kernels/): its GPU
# tests (bits against the wgmma kernel, every configuration, both copies), bi-bench --only qmm
# on both, Nsight Compute's per-instruction counts of the new kernel at M = 1, K = 6144,
# N = 2048, and last the decode attention pipeline depths at B = 1 and 2 (stages.py).
set -u
export PYTHONUNBUFFERED=1
R=$OUT/q; mkdir -p $R
pack() { (cd $OUT && tar czf q.tgz q); }
date -u +%FT%TZ | tee $R/date.txt
ln -sfn $PWD/bi_rl/assets .ab/base/bi_rl/assets
for d in rollouts tools examples pyproject.toml; do ln -sfn $PWD/$d .ab/base/$d; done
s=$SECONDS
BI_RL_CUDA_CACHE=/tmp/nv-new timeout 230 python3 -m pytest -q -p no:cacheprovider -n 14 \
  tests/test_cuda_hopper.py tests/test_cuda_qmm.py -k "quantized or qmm" > $R/tests.log 2>&1
echo "tests rc=$? [$((SECONDS-s)) s]" | tee -a $R/date.txt
tail -1 $R/tests.log; grep -E "^(FAILED|ERROR)" $R/tests.log | head -8
pack
for a in new base new2; do
  s=$SECONDS
  case $a in base) p=$PWD/.ab/base ;; *) p=$PWD ;; esac
  BI_RL_CUDA_CACHE=/tmp/nv-${a%2} PYTHONPATH=$p timeout 100 python3 -P -m bi_rl.cli.bench --only qmm \
    -v --json $R/qmm-$a.json > $R/qmm-$a.log 2>&1
  echo "bench $a rc=$? [$((SECONDS-s)) s]" | tee -a $R/date.txt
  grep -E "^qmm 4-bit g64 M=(1|8) K=6144 N=2048:" $R/qmm-$a.log
  pack
done
BI_RL_CUDA_CACHE=/tmp/nv-new PYTHONPATH=$PWD timeout 60 ncu --set full --import-source no --page source \
  --print-source sass --clock-control none -k regex:qmm --launch-skip 2 --launch-count 1 \
  python3 tools/cuda_profile.py qmm-m1-down > $R/ncu-sass.txt 2>&1
echo "ncu rc=$?"; sed -n '/^0x/p' $R/ncu-sass.txt | cut -c1-125 > $R/sass.txt; rm -f $R/ncu-sass.txt
for a in new base; do
  case $a in base) p=$PWD/.ab/base ;; *) p=$PWD ;; esac
  BI_RL_CUDA_CACHE=/tmp/nv-$a PYTHONPATH=$p timeout 60 ncu --clock-control none -k regex:qmm \
    --launch-skip 2 --launch-count 1 --metrics gpu__time_duration.sum,smsp__inst_executed.sum \
    python3 -P $PWD/tools/cuda_profile.py qmm-m1-down > $R/ncu-time-$a.txt 2>&1
  echo "ncu $a"; grep -E "duration|inst_executed" $R/ncu-time-$a.txt
done
pack
PYTHONPATH=$PWD timeout 90 python3 -P docs/h200/2026-12-03/s21/stages.py > $R/stages.txt 2>&1
echo "stages rc=$?"; cat $R/stages.txt
pack
