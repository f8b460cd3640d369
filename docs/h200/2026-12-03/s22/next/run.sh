#!/usr/bin/env bash
# For the next device session, after main's checks (README item 1), arms.sh here and staging
# (call: `bash .stage2/install > /tmp/install.log && bash docs/h200/2026-12-03/s22/next/run.sh`,
# carry .stage2 and .ab): arm pipe's few-row and grouped quantized GPU tests (every few-row
# configuration against wgmma, K long enough that every stage count wraps, a tail k-tile),
# ncu's duration and instruction count at M = 1, K = 6144, N = 2048 on both arms, then
# qmm_ab.py on main, pipe, main, pipe and bi-bench --only qmm on both, then end to end at
# B = 1 and 8, 4-bit, on main, pipe and main again on this one machine (so that the runs are
# an A/B). Two calls: PARTS="tests ncu ab splits" (about 6 minutes; splits: decode
# attention at B = 1 and 2 with 8, 16 and 32 splits a block forced, on main), then PARTS=e2e
# (about 8).
set -u
export PYTHONUNBUFFERED=1
R=$OUT/n; mkdir -p $R
pack() { (cd $OUT && tar czf n.tgz n); }
arm() { case $1 in main) echo $PWD ;; *) echo $PWD/.ab/$1 ;; esac; }
date -u +%FT%TZ | tee -a $R/date.txt
ln -sfn $PWD/bi_rl/assets .ab/pipe/bi_rl/assets
for d in rollouts tools examples pyproject.toml; do ln -sfn $PWD/$d .ab/pipe/$d; done
for part in ${PARTS:-tests ncu ab splits e2e}; do
  s=$SECONDS
  case $part in
    tests)
      PYTHONSAFEPATH=1 BI_RL_CUDA_CACHE=/tmp/nv-pipe PYTHONPATH=$(arm pipe) timeout 170 python3 -P \
        -m pytest -q -p no:cacheprovider -n 14 .ab/pipe/tests/test_cuda_hopper.py \
        .ab/pipe/tests/test_cuda_qmm.py -k "quantized or qmm" > $R/tests-pipe.log 2>&1
      echo "tests pipe rc=$?"; tail -1 $R/tests-pipe.log
      grep -E "^(FAILED|ERROR)" $R/tests-pipe.log | head -8 ;;
    ncu)
      for a in pipe main; do
        BI_RL_CUDA_CACHE=/tmp/nv-$a PYTHONPATH=$(arm $a) timeout 60 ncu --clock-control none \
          -k regex:qmm --launch-skip 2 --launch-count 1 \
          --metrics gpu__time_duration.sum,smsp__inst_executed.sum \
          python3 -P $PWD/tools/cuda_profile.py qmm-m1-down > $R/ncu-$a.txt 2>&1
        echo "ncu $a"; grep -E "duration|inst_executed" $R/ncu-$a.txt | cut -c1-90
      done ;;
    ab)
      for a in main pipe main pipe; do
        BI_RL_CUDA_CACHE=/tmp/nv-$a PYTHONPATH=$(arm $a) timeout 100 python3 -P \
          docs/h200/2026-12-03/s22/qmm_ab.py $a >> $R/qmm-ab.jsonl 2>> $R/qmm-ab.err
        echo "qmm_ab $a rc=$?"
      done
      # the logits shapes too, where the four-warp blocks (213 registers with the patch,
      # 156 without: 2 blocks a multiprocessor by registers where 3 fitted) are picked
      for a in main pipe; do
        BI_RL_CUDA_CACHE=/tmp/nv-$a PYTHONPATH=$(arm $a) timeout 120 python3 -P -m bi_rl.cli.bench \
          --only qmm -v --json $R/qmm-$a.json > $R/qmm-$a.log 2>&1
        echo "bench $a rc=$?"; grep -E "^qmm 4-bit g64 M=(1|8) K=" $R/qmm-$a.log
      done
      python3 - $R/qmm-ab.jsonl <<'PY'
import collections, json, sys
by = collections.defaultdict(list)
for line in open(sys.argv[1]):
    r = json.loads(line)
    by[(r["bits"], r["m"], r["k"], r["n"])].append(f'{r["arm"]} {r["ratio"]:.2f}')
for key, v in by.items():
    print(key, " | ".join(v))
PY
      ;;
    splits)
      BI_RL_CUDA_CACHE=/tmp/nv-main PYTHONPATH=$(arm main) timeout 90 python3 -P \
        docs/h200/2026-12-03/s22/next/splits.py > $R/splits.txt 2>&1
      echo "splits rc=$?"; cat $R/splits.txt ;;
    e2e)
      # 4-bit alone (the kernel changes only its rows), main, pipe, main on this one host; the
      # first writes the models (about 60 s) and compiles the model's kernels
      for a in main pipe main2; do
        t=160; [ $a = main ] && t=260
        E2E_MODELS=4-bit BATCHES=1,8 PYTHONPATH=$(arm ${a%2}) BI_RL_CUDA_CACHE=/tmp/nv-${a%2} \
          T_LONG=1 timeout $t bash tools/cuda_device_run.sh $R/e2e-$a e2e17 > $R/e2e-$a.txt 2>&1
        echo "e2e $a rc=$?"; grep -E "x mlx-lm" $R/e2e-$a/e2e17.log
        pack
      done ;;
  esac
  echo "[$part: $((SECONDS - s)) s]" | tee -a $R/date.txt
  pack
done
