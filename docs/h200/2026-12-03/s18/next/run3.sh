#!/usr/bin/env bash
# For the next device session, after arms.sh here and staging (`bash .stage2/install >
# /tmp/install.log && bash docs/h200/2026-12-03/s18/next/run3.sh`, carry .stage2 and .ab): arm
# mask through the attention GPU tests, then bi-bench --only attention mask, main (the
# left-padded bool-mask prefill case is the one the patch can move; the others are guards
# that it moved nothing else). About 5 minutes.
set -u
export PYTHONUNBUFFERED=1
R=$OUT/m; mkdir -p $R
pack() { (cd $OUT && tar czf m.tgz m); }
arm() { echo $PWD/.ab/$1; }
date -u +%FT%TZ | tee $R/date.txt
s=$SECONDS
PYTHONSAFEPATH=1 MLX_PTX_CACHE_DIR=/tmp/mlx-mask PYTHONPATH=$(arm mask) timeout 240 python3 -P -m pytest -q -p no:cacheprovider -n 15 \
  tests/test_cuda_hopper_attention.py tests/test_cuda_attention.py > $R/tests.log 2>&1
echo "tests rc=$? [$((SECONDS-s)) s]" | tee -a $R/date.txt
tail -1 $R/tests.log; grep -E "^(FAILED|ERROR)" $R/tests.log | head -5
pack
for a in mask main; do
  s=$SECONDS
  MLX_PTX_CACHE_DIR=/tmp/mlx-$a PYTHONPATH=$(arm $a) python3 -P -c "import bi_rl; print(bi_rl.__file__)" > $R/attn-$a.log
  MLX_PTX_CACHE_DIR=/tmp/mlx-$a PYTHONPATH=$(arm $a) timeout 100 python3 -P -m bi_rl.cli.bench --only attention -v --json $R/attn-$a.json >> $R/attn-$a.log 2>&1
  echo "bench $a rc=$? [$((SECONDS-s)) s]" | tee -a $R/date.txt
  grep -E "^attention prefill" $R/attn-$a.log | head -9
  pack
done
