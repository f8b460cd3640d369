#!/usr/bin/env bash
# Call 2 of this session's second machine (carry .stage2 and .ab; `bash .stage2/install >
# /tmp/install.log && bash docs/h200/2026-12-03/s22/run.sh`): arm fc2 (main with the few-row
# quantized kernel's copy carrying its per-thread quantities and one LOP3 a dequantised value)
# against main. Its few-row and grouped quantized GPU tests first, then ncu at M = 1,
# K = 6144, N = 2048 on both, then qmm_ab.py on main, fc2, main, fc2, then end to end on the
# 1.7B shape at batch 1 and 8 with fc2.
set -u
export PYTHONUNBUFFERED=1
R=$OUT/a; mkdir -p $R
pack() { (cd $OUT && tar czf a.tgz a); }
arm() { case $1 in main) echo $PWD ;; *) echo $PWD/.ab/$1 ;; esac; }
date -u +%FT%TZ | tee $R/date.txt
ln -sfn $PWD/bi_rl/assets .ab/fc2/bi_rl/assets
for d in rollouts tools examples pyproject.toml; do ln -sfn $PWD/$d .ab/fc2/$d; done
s=$SECONDS
PYTHONSAFEPATH=1 BI_RL_CUDA_CACHE=/tmp/nv-fc2 PYTHONPATH=$(arm fc2) timeout 170 python3 -P -m pytest -q \
  -p no:cacheprovider -n 14 .ab/fc2/tests/test_cuda_hopper.py .ab/fc2/tests/test_cuda_qmm.py \
  -k "quantized or qmm" > $R/tests-fc2.log 2>&1
echo "tests fc2 rc=$? [$((SECONDS-s)) s]" | tee -a $R/date.txt
tail -1 $R/tests-fc2.log; grep -E "^(FAILED|ERROR)" $R/tests-fc2.log | head -8
pack
for a in fc2 main; do
  BI_RL_CUDA_CACHE=/tmp/nv-$a PYTHONPATH=$(arm $a) timeout 60 ncu --clock-control none -k regex:qmm \
    --launch-skip 2 --launch-count 1 --metrics gpu__time_duration.sum,smsp__inst_executed.sum \
    python3 -P $PWD/tools/cuda_profile.py qmm-m1-down > $R/ncu-$a.txt 2>&1
  echo "ncu $a"; grep -E "duration|inst_executed" $R/ncu-$a.txt | cut -c1-90
done
pack
for a in main fc2 main fc2; do
  s=$SECONDS
  BI_RL_CUDA_CACHE=/tmp/nv-$a PYTHONPATH=$(arm $a) timeout 100 python3 -P \
    docs/h200/2026-12-03/s22/qmm_ab.py $a >> $R/qmm-ab.jsonl 2>> $R/qmm-ab.err
  echo "qmm_ab $a rc=$? [$((SECONDS-s)) s]" | tee -a $R/date.txt
  pack
done
python3 - $R/qmm-ab.jsonl <<'PY'
import json, sys, collections
rows = [json.loads(l) for l in open(sys.argv[1])]
by = collections.defaultdict(list)
for r in rows:
    by[(r["bits"], r["m"], r["k"], r["n"])].append(f'{r["arm"]} {r["ratio"]:.2f}')
for key, v in by.items():
    print(key, " | ".join(v))
PY
s=$SECONDS
BATCHES=1,8 PYTHONPATH=$(arm fc2) BI_RL_CUDA_CACHE=/tmp/nv-fc2 T_LONG=1 timeout ${T_E2E:-300} \
  bash tools/cuda_device_run.sh $R/e2e17 e2e17 > $R/e2e17.txt 2>&1
echo "e2e17 fc2 rc=$? [$((SECONDS-s)) s]"; tail -22 $R/e2e17.txt
pack
