# End to end on the 1.7B shape at batch 64 (models from c1 in /tmp/q17), 3 repeats, mlx-lm's
# batch_generate beside it.
export PYTHONUNBUFFERED=1 BI_RL_CUDA_CACHE=/tmp/nvrtc
R=$OUT/e2; mkdir -p $R; git log -1 --format=%h > $R/tree.txt 2>/dev/null
date -u +%FT%TZ | tee $R/date.txt
s=$SECONDS
timeout 500 python3 -m bi_rl.cli.bench --only e2e -v --repeats 3 --model-dir /tmp/q17 \
  --batches 64 --json $R/e2e-64.json > $R/e2e-64.log 2>&1
echo "e2e rc=$? [$((SECONDS-s)) s]"; tail -8 $R/e2e-64.log
