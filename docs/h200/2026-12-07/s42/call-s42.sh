#!/usr/bin/env bash
# Prepared in the forty-first session for the next one, where no machine started (this
# file never ran). The fortieth session's plan (docs/h200/2026-12-07/s40/next/call-s41.sh)
# re-ordered so that the fewest cells come first, and two steps added for the forty-first
# session's change (engine caches hand stock attention no mask when no row is padded,
# bi_rl.rollout.caches.EngineBatchKVCache):
# 1. On the GPU: the scorer, queued-layer, trainer, concatenation and golden-log tests, and
#    the engine and cache tests (the new mode-off test compares masked and unmasked stock
#    attention on CUDA).
# 2. One 431-token sequence's strict rescoring, block-shape rule off and on
#    (BI_RL_HOPPER_FILL=1); its bench run writes the 1.7B-shaped models.
# 3. Mode off's bare decode step with the mask dropped and kept (mask_ab.py, from
#    docs/cpu/2026-12-07/s41/), B = 1 and 8, prompts of one length and of 150-350.
# 4. End to end, bf16 B = 1 and 8 and 4-bit B = 1, 3 repeats.
# 5. The scorer with layers queued and whole (score_queue_ab.py, docs/cpu/2026-12-07/s40/),
#    B = 1 and 16.
# 6. If time is left: end to end in bf16 at B = 1 and 8 with BI_RL_CONCAT_PROJECTIONS=1.
# 7. If time is still left: long-context rescoring, 4 x 8192, bf16.
# Copy this, mask_ab.py and score_queue_ab.py to the repository root; carry [".stage2"].
python3 -P -c "import mlx.core" 2>/dev/null || { bash .stage2/install > /tmp/install.log 2>&1; echo "install rc=$? [$SECONDS s]"; }
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
T=${T_ALL:-560}
o=$OUT/n; mkdir -p $o
date -u +%FT%TZ | tee $o/date.txt
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $o/device.txt
git log --oneline -1 > $o/commit.txt 2>/dev/null
xd=""; python3 -P -c "import xdist" 2>/dev/null && xd="-p xdist -n 8"
timeout ${T_TESTS:-150} python3 -P -m pytest -q -p no:cacheprovider $xd tests/test_engine.py \
  tests/test_caches.py tests/test_scorer.py tests/test_queued.py tests/test_policy.py \
  tests/test_concat.py tests/test_rollouts_golden.py > $o/tests.log 2>&1
echo "tests rc=$? [$SECONDS s]"; grep -E "FAILED|passed|failed" $o/tests.log | tail -8
M=/tmp/qwen3-1.7b-e2e
for fill in 0 1; do
  BI_RL_HOPPER_FILL=$fill timeout 100 python3 -P -m bi_rl.cli.bench --only rescore-long -v \
    --repeats 5 --model-dir $M --models bf16 --long-batch 1 --long-length 431 \
    --json $o/rescore-1x431-fill$fill.json > $o/rescore-1x431-fill$fill.log 2>&1
  echo "rescore 1x431 fill=$fill rc=$? [$SECONDS s]"; tail -1 $o/rescore-1x431-fill$fill.log
done
for bs in 1 8; do
  timeout 110 python3 -P mask_ab.py $M/bf16 $bs 64 off,strict >> $o/mask-ab.txt 2>&1
  echo "mask ab b$bs rc=$? [$SECONDS s]"
done; grep dropped $o/mask-ab.txt
left=$(( T - SECONDS - 60 ))
[ $left -gt 60 ] && timeout $left python3 -P -m bi_rl.cli.bench --only e2e -v --repeats 3 \
  --model-dir $M --batches 1,8 --models bf16 --json $o/e2e.json > $o/e2e.log 2>&1
echo "e2e bf16 rc=$? [$SECONDS s]"; grep " B=" $o/e2e.log | tail -4
left=$(( T - SECONDS - 30 ))
[ $left -gt 60 ] && timeout $left python3 -P -m bi_rl.cli.bench --only e2e -v --repeats 3 \
  --model-dir $M --batches 1 --models 4-bit --json $o/e2e-q4.json > $o/e2e-q4.log 2>&1
echo "e2e 4-bit rc=$? [$SECONDS s]"; grep " B=" $o/e2e-q4.log | tail -2
for bs in 1 16; do
  left=$(( T - SECONDS )); [ $left -gt 40 ] || break
  timeout $(( left < 60 ? left : 60 )) python3 -P score_queue_ab.py $M/bf16 64 $bs 150,350 >> $o/score-queue-ab.txt 2>&1
  echo "score queue b$bs rc=$? [$SECONDS s]"
done; grep samples $o/score-queue-ab.txt
left=$(( T - SECONDS ))
[ $left -gt 60 ] && BI_RL_CONCAT_PROJECTIONS=1 timeout $left python3 -P -m bi_rl.cli.bench \
  --only e2e -v --repeats 3 --model-dir $M --batches 1,8 --models bf16 \
  --json $o/e2e-concat-all.json > $o/e2e-concat-all.log 2>&1
echo "e2e concat all rc=$? [$SECONDS s]"; grep " B=" $o/e2e-concat-all.log | tail -2
left=$(( T - SECONDS ))
[ $left -gt 60 ] && timeout $left python3 -P -m bi_rl.cli.bench --only rescore-long -v \
  --repeats 3 --model-dir $M --models bf16 --json $o/rescore-long.json > $o/rescore-long.log 2>&1
echo "rescore-long rc=$? [$SECONDS s]"; tail -2 $o/rescore-long.log
tar czf $OUT/n.tgz -C $OUT n && rm -rf $o
