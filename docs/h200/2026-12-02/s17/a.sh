#!/usr/bin/env bash
# Run a (seventeenth session): the wgmma prefill attention with the split's fold compiled into
# a step of its own, the packed P carry at every head dim, and the stage index and descriptor
# halves carried through the loop (arm v, .ab/v) against main (arm main, .ab/main: the tree of HEAD).
#   1. the attention GPU tests on arm v (bit for bit against the mma.sync kernel), in 10
#      pytest-xdist workers
#   2. bi-bench --only attention: main, v, v, main, each in its own process, alone on the GPU
#   3. ncu of one launch of each arm's prefill attention at 8192 causal tokens, head dim 128
#      (instructions executed, duration), if time is left
set -u
bash .stage2/install > "$OUT/install.log" 2>&1 || { tail -5 "$OUT/install.log"; exit 1; }
export PYTHONUNBUFFERED=1
R=$OUT/a; mkdir -p $R
date -u +%FT%TZ | tee $R/date.txt
arm() { echo $PWD/.ab/$1; }
for a in main v; do
  (cd $(arm $a) && find bi_rl kernels -type f \( -name '*.py' -o -name '*.cu' -o -name '*.cuh' \) -print0 \
    | sort -z | xargs -0 sha256sum | sha256sum) | sed "s/^/$a /" >> $R/tree.txt
done
# the Qwen3-1.7B-shaped models for run b, written meanwhile
(PYTHONPATH=$(arm main) python3 -P -c "from pathlib import Path; from bi_rl.bench.e2e import WORKLOADS, write_models; write_models(WORKLOADS['qwen3-1.7b'], Path('/tmp/q17'))" > $R/q17.log 2>&1; echo "q17 rc=$?" >> $R/q17.log) &
s=$SECONDS
PYTHONSAFEPATH=1 MLX_PTX_CACHE_DIR=/tmp/mlx-v PYTHONPATH=$(arm v) timeout 230 python3 -P -m pytest -q -p no:cacheprovider -n 10 \
  tests/test_cuda_hopper_attention.py tests/test_cuda_attention.py > $R/tests.log 2>&1
echo "tests rc=$? [$((SECONDS-s)) s]" >> $R/date.txt
wait
for a in main v v main; do
  s=$SECONDS
  n=$(ls $R/attn-$a-*.json 2>/dev/null | wc -l)
  MLX_PTX_CACHE_DIR=/tmp/mlx-$a PYTHONPATH=$(arm $a) python3 -P -c "import bi_rl; print(bi_rl.__file__)" > $R/attn-$a-$n.log
  MLX_PTX_CACHE_DIR=/tmp/mlx-$a PYTHONPATH=$(arm $a) timeout 100 python3 -P -m bi_rl.cli.bench --only attention -v --json $R/attn-$a-$n.json >> $R/attn-$a-$n.log 2>&1
  echo "bench $a-$n rc=$? [$((SECONDS-s)) s]" >> $R/date.txt
done
cat $R/date.txt
tail -1 $R/tests.log; grep -E "^(FAILED|ERROR)" $R/tests.log | head -5
for a in main v; do
  s=$SECONDS
  MLX_PTX_CACHE_DIR=/tmp/mlx-$a PYTHONPATH=$(arm $a) timeout 60 ncu --profile-from-start off --clock-control none --metrics gpu__time_duration.sum,smsp__inst_executed.sum,sm__warps_active.avg.pct_of_peak_sustained_active,sm__inst_executed.avg.per_cycle_active -k regex:bi_hattn python3 -P tools/attn_profile.py --case prefill > $R/ncu-$a.txt 2>&1
  echo "ncu $a rc=$? [$((SECONDS-s)) s]"; grep -E "bi_hattn|duration|inst_executed" $R/ncu-$a.txt | head -8
done
wait; tail -1 $R/q17.log
