# End to end on the 1.7B shape (models from c1 in /tmp/q17), batches 1 and 8, 3 repeats, with
# mlx-lm's batch_generate beside it; then the bare 4-bit decode step grouped vs separate.
export PYTHONUNBUFFERED=1 BI_RL_CUDA_CACHE=/tmp/nvrtc
R=$OUT/e1; mkdir -p $R; git log -1 --format=%h > $R/tree.txt 2>/dev/null
date -u +%FT%TZ | tee $R/date.txt
s=$SECONDS
timeout 400 python3 -m bi_rl.cli.bench --only e2e -v --repeats 3 --model-dir /tmp/q17 \
  --batches 1,8 --json $R/e2e-1-8.json > $R/e2e-1-8.log 2>&1
echo "e2e rc=$? [$((SECONDS-s)) s]"; tail -14 $R/e2e-1-8.log
s=$SECONDS
PYTHONPATH=$PWD timeout 120 python3 docs/h200/2026-12-02/s13/ab_qgroup.py > $R/ab_qgroup.log 2>&1
echo "ab rc=$? [$((SECONDS-s)) s]"; tail -12 $R/ab_qgroup.log
