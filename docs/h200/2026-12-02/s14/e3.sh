# After aa182b1 (the scorer's head in pieces of at most 2**31 - 1 elements): rescoring the
# 4-bit 1.7B shape at batches 16 / 32 / 64 in both modes (score_fail.py; "off" failed at 64 in
# run f1), then the end-to-end bench at batch 64, 3 repeats, mlx-lm's batch_generate beside it.
export PYTHONUNBUFFERED=1 BI_RL_CUDA_CACHE=/tmp/nvrtc
R=$OUT/e3; mkdir -p $R; git log -1 --format=%h > $R/tree.txt 2>/dev/null
date -u +%FT%TZ | tee $R/date.txt
s=$SECONDS
PYTHONPATH=$PWD python3 -c "from pathlib import Path; from bi_rl.bench.e2e import WORKLOADS, write_models; write_models(WORKLOADS['qwen3-1.7b'], Path('/tmp/q17'))" > $R/q17.log 2>&1
echo "models rc=$? [$((SECONDS-s)) s]"
s=$SECONDS
PYTHONPATH=$PWD timeout 90 python3 docs/h200/2026-12-02/s14/score_fail.py /tmp/q17/q4 2>&1 | grep -v compiling > $R/score_fail.log
echo "score_fail [$((SECONDS-s)) s]"; grep score $R/score_fail.log
s=$SECONDS
timeout ${T_E2E:-330} python3 -m bi_rl.cli.bench --only e2e -v --repeats 3 --model-dir /tmp/q17 \
  --batches 64 --json $R/e2e-64.json > $R/e2e-64.log 2>&1
echo "e2e rc=$? [$((SECONDS-s)) s]"; tail -8 $R/e2e-64.log
