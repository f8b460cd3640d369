#!/usr/bin/env bash
# Run b (eighteenth session, first call after staging: `bash .stage2/install > /tmp/install.log
# && bash docs/h200/2026-12-03/s18/b.sh`, carry .stage2 and .ab): arm ts (main with each row's
# maximum taken as a tree, s17/next/tree-max.patch, and the rescale skipped where both factors
# are 1) through the attention GPU tests, while the 1.7B-shaped models for run c are written;
# then bi-bench --only attention ts, main, tree (the tree alone), and the short ncu metrics of
# one launch of each arm's prefill attention (8192 causal tokens, head dim 128).
set -u
export PYTHONUNBUFFERED=1
R=$OUT/b; mkdir -p $R
date -u +%FT%TZ | tee $R/date.txt
arm() { echo $PWD/.ab/$1; }
for a in main tree ts; do
  (cd $(arm $a) && find bi_rl kernels -type f \( -name '*.py' -o -name '*.cu' -o -name '*.cuh' \) -print0 \
    | sort -z | xargs -0 sha256sum | sha256sum) | sed "s/^/$a /" >> $R/tree.txt
done
(PYTHONPATH=$PWD python3 -c "from pathlib import Path; from bi_rl.bench.e2e import WORKLOADS, write_models; write_models(WORKLOADS['qwen3-1.7b'], Path('/tmp/q17'))" > $R/q17.log 2>&1; echo "models rc=$?" >> $R/q17.log) &
s=$SECONDS
PYTHONSAFEPATH=1 MLX_PTX_CACHE_DIR=/tmp/mlx-ts PYTHONPATH=$(arm ts) timeout 250 python3 -P -m pytest -q -p no:cacheprovider -n 10 \
  tests/test_cuda_hopper_attention.py tests/test_cuda_attention.py > $R/tests.log 2>&1
echo "tests rc=$? [$((SECONDS-s)) s]" >> $R/date.txt
wait
for a in ts main tree; do
  s=$SECONDS
  MLX_PTX_CACHE_DIR=/tmp/mlx-$a PYTHONPATH=$(arm $a) python3 -P -c "import bi_rl; print(bi_rl.__file__)" > $R/attn-$a.log
  MLX_PTX_CACHE_DIR=/tmp/mlx-$a PYTHONPATH=$(arm $a) timeout 100 python3 -P -m bi_rl.cli.bench --only attention -v --json $R/attn-$a.json >> $R/attn-$a.log 2>&1
  echo "bench $a rc=$? [$((SECONDS-s)) s]" >> $R/date.txt
done
cat $R/date.txt
tail -1 $R/tests.log; grep -E "^(FAILED|ERROR)" $R/tests.log | head -5
for a in ts main; do
  s=$SECONDS
  MLX_PTX_CACHE_DIR=/tmp/mlx-$a PYTHONPATH=$(arm $a) timeout 60 ncu --profile-from-start off --clock-control none --metrics gpu__time_duration.sum,smsp__inst_executed.sum,sm__inst_executed.avg.per_cycle_active -k regex:bi_hattn python3 -P tools/attn_profile.py --case prefill > $R/ncu-$a.txt 2>&1
  echo "ncu $a rc=$? [$((SECONDS-s)) s]"; grep -E "duration|inst_executed" $R/ncu-$a.txt | head -4
done
tail -1 $R/q17.log
cd $OUT && tar czf b.tgz b && rm -rf b
