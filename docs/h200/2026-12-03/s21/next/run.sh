#!/usr/bin/env bash
# For the next device session, after arms.sh here and staging (call 2: `bash .stage2/install >
# /tmp/install.log && bash docs/h200/2026-12-03/s21/next/run.sh`, carry .stage2 and .ab):
# arm prod's few-row and grouped quantized GPU tests (its own tests/: every few-row
# configuration, the producer one among them, against wgmma, with K long enough for the
# stages and fragment slots to wrap), then ncu's duration and instruction count at M = 1,
# K = 6144, N = 2048 on both arms, then bi-bench --only qmm on main, prod, main (each with
# its own kernel cache, compiled on the first pass), then producers_forced.py on prod (0, 2, 4
# and 8 producer warps forced). About 9 minutes.
set -u
export PYTHONUNBUFFERED=1
R=$OUT/p; mkdir -p $R
pack() { (cd $OUT && tar czf p.tgz p); }
arm() { case $1 in main*) echo $PWD ;; *) echo $PWD/.ab/${1%2} ;; esac; }
date -u +%FT%TZ | tee $R/date.txt
ln -sfn $PWD/bi_rl/assets .ab/prod/bi_rl/assets
for d in rollouts tools examples pyproject.toml; do ln -sfn $PWD/$d .ab/prod/$d; done
s=$SECONDS
PYTHONSAFEPATH=1 BI_RL_CUDA_CACHE=/tmp/nv-prod PYTHONPATH=$(arm prod) timeout 200 python3 -P -m pytest -q \
  -p no:cacheprovider -n 14 .ab/prod/tests/test_cuda_hopper.py .ab/prod/tests/test_cuda_qmm.py \
  -k "quantized or qmm" > $R/tests-prod.log 2>&1
echo "tests prod rc=$? [$((SECONDS-s)) s]" | tee -a $R/date.txt
tail -1 $R/tests-prod.log; grep -E "^(FAILED|ERROR)" $R/tests-prod.log | head -8
pack
for a in prod main; do
  BI_RL_CUDA_CACHE=/tmp/nv-$a PYTHONPATH=$(arm $a) timeout 60 ncu --clock-control none -k regex:qmm \
    --launch-skip 2 --launch-count 1 --metrics gpu__time_duration.sum,smsp__inst_executed.sum \
    python3 -P $PWD/tools/cuda_profile.py qmm-m1-down > $R/ncu-$a.txt 2>&1
  echo "ncu $a"; grep -E "custom_kernel|duration|inst_executed" $R/ncu-$a.txt | cut -c1-90
done
pack
for a in main prod main2; do
  s=$SECONDS
  BI_RL_CUDA_CACHE=/tmp/nv-${a%2} PYTHONPATH=$(arm $a) timeout 120 python3 -P -m bi_rl.cli.bench \
    --only qmm -v --json $R/qmm-$a.json > $R/qmm-$a.log 2>&1
  echo "bench $a rc=$? [$((SECONDS-s)) s]" | tee -a $R/date.txt
  grep -E "^qmm 4-bit g64 M=(1|8) K=" $R/qmm-$a.log
  pack
done
PYTHONPATH=$(arm prod) BI_RL_CUDA_CACHE=/tmp/nv-prod timeout 120 python3 -P \
  docs/h200/2026-12-03/s21/next/producers_forced.py > $R/forced.txt 2>&1
echo "forced rc=$?"; cat $R/forced.txt
pack
