#!/usr/bin/env bash
# Call 3 (same machine as a.sh): bi-bench --only qmm on qn and main (the 4-bit g64 cases at
# the Qwen3-1.7B and Llama-3-8B projections, M = 1 / 8 / 64 / 512 / 4096; qn changes M <= 16),
# then bi-bench --only attention on range, main, range (the left-padded prefill and decode
# cases are the ones row-range should move; the others are guards).
set -u
export PYTHONUNBUFFERED=1
R=$OUT/b; mkdir -p $R
pack() { (cd $OUT && tar czf b.tgz b); }
arm() { case $1 in main*) echo $PWD ;; *) echo $PWD/.ab/${1%2} ;; esac; }
date -u +%FT%TZ | tee $R/date.txt
bench() {  # family arm
  local s=$SECONDS c=/tmp/mlx-${2%2}
  MLX_PTX_CACHE_DIR=$c PYTHONPATH=$(arm $2) python3 -P -c "import bi_rl; print(bi_rl.__file__)" > $R/$1-$2.log
  MLX_PTX_CACHE_DIR=$c PYTHONPATH=$(arm $2) timeout ${3:-110} python3 -P -m bi_rl.cli.bench --only $1 -v \
    --json $R/$1-$2.json >> $R/$1-$2.log 2>&1
  echo "bench $1 $2 rc=$? [$((SECONDS-s)) s]" | tee -a $R/date.txt
  pack
}
bench qmm qn 150; grep -E "M=(1|8) " $R/qmm-qn.log | head -16
bench qmm main 150; grep -E "M=(1|8) " $R/qmm-main.log | head -16
for a in range main range2; do
  bench attention $a
  grep -E "^attention (prefill bf16 left|decode bf16 left|prefill bf16 16/8 D=128 tokens=8192)" $R/attention-$a.log
done
