#!/usr/bin/env bash
# Nineteenth session, call 2 (carry .stage2 and .ab): the attention GPU tests on arms mask
# (s18/next/mask-unit.patch) and unroll (s18/next/unroll-stages.patch), built from main 93b018c
# under .ab/ (bi_rl/ without its assets, and kernels/), side by side, 8 workers each.
set -u
export PYTHONUNBUFFERED=1
R=$OUT/t; mkdir -p $R
date -u +%FT%TZ | tee $R/date.txt
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv > $R/gpu.txt 2>&1
s=$SECONDS
for a in mask unroll; do
  PYTHONSAFEPATH=1 MLX_PTX_CACHE_DIR=/tmp/mlx-$a PYTHONPATH=$PWD/.ab/$a timeout 330 python3 -P -m pytest -q \
    -p no:cacheprovider -n 8 tests/test_cuda_hopper_attention.py tests/test_cuda_attention.py \
    > $R/tests-$a.log 2>&1 &
done
wait
echo "tests [$((SECONDS-s)) s]" | tee -a $R/date.txt
for a in mask unroll; do echo "$a: $(tail -1 $R/tests-$a.log)"; grep -E "^(FAILED|ERROR)" $R/tests-$a.log | head -5; done
grep -h "bi_rl/__init__\|import file mismatch" $R/tests-*.log | head -3
cd $OUT && tar czf t.tgz t
