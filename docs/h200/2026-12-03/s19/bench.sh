#!/usr/bin/env bash
# Nineteenth session, call 3 (same machine, carry .stage2 and .ab): bi-bench --only attention
# on main, mask, unroll, main again (the machine's drift), kernel caches from call 2; then
# long-context rescoring on main (s17/next/long.py, 4 x 8192 tokens, bf16 and 4-bit).
set -u
export PYTHONUNBUFFERED=1
R=$OUT/b; mkdir -p $R
pack() { (cd $OUT && tar czf b.tgz b); }
arm() { case $1 in main*) echo $PWD ;; *) echo $PWD/.ab/$1 ;; esac; }
date -u +%FT%TZ | tee $R/date.txt
for a in main mask unroll main2; do
  s=$SECONDS
  c=/tmp/mlx-${a%2}
  MLX_PTX_CACHE_DIR=$c PYTHONPATH=$(arm $a) python3 -P -c "import bi_rl; print(bi_rl.__file__)" > $R/attn-$a.log
  MLX_PTX_CACHE_DIR=$c PYTHONPATH=$(arm $a) timeout 110 python3 -P -m bi_rl.cli.bench --only attention -v --json $R/attn-$a.json >> $R/attn-$a.log 2>&1
  echo "bench $a rc=$? [$((SECONDS-s)) s]" | tee -a $R/date.txt
  grep -E "^attention prefill" $R/attn-$a.log | head -10
  pack
done
export PYTHONPATH=$PWD MLX_PTX_CACHE_DIR=/tmp/mlx-main
s=$SECONDS
python3 -c "from pathlib import Path; from bi_rl.bench.e2e import WORKLOADS, write_models; write_models(WORKLOADS['qwen3-1.7b'], Path('/tmp/q17'))" > $R/q17.log 2>&1
echo "models rc=$? [$((SECONDS-s)) s]" | tee -a $R/date.txt
s=$SECONDS
timeout 170 python3 docs/h200/2026-12-02/s17/next/long.py /tmp/q17 2>&1 | grep -v "compiling CUDA" > $R/long.txt
echo "long rc=$? [$((SECONDS-s)) s]" | tee -a $R/date.txt; cat $R/long.txt
pack
