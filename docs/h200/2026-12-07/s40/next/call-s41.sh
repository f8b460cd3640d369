#!/usr/bin/env bash
# Prepared in the fortieth session for the next one. Each step cut to the time left:
# 1. On the GPU, the tests that run the scorer, the trainer's invariant pass and the
#    concatenated projections, with decoder layers now queued as built (bi_rl.score.queued;
#    26c090d, e336f05), and the GPU golden logs.
# 2. (run after 3, whose bench run writes the models) The scorer with layers queued and without (score_queue_ab.py, from
#    docs/cpu/2026-12-07/s40/) on the 1.7B shape in bf16: 64 samples of 150-350 prompt
#    tokens, batches of 1, 8 and 16. In the fortieth session a wrapper doing the same took
#    0.73x (strict) and 0.78x (off) of one batch's time at B = 1.
# 3. (run first; it writes the bench's models) One 431-token sequence's rescoring split between GEMMs and attention, with the
#    block-shape rule off and on (BI_RL_HOPPER_FILL=1): with the host's building now
#    overlapped, whether the rule's smaller blocks show (the fortieth session: GEMMs 4.3 ms,
#    attention 1.5 ms of strict's 4.6 ms over off, rule off).
# 4. Long-context rescoring, 4 x 8192 tokens, bf16 and 4-bit (its target: strict >= 0.85x
#    of off; 0.80 in bf16 on an H100 in the thirty-sixth session).
# 5. End to end, bf16 and 4-bit at B = 1 and 8, 3 repeats (the rescoring columns now with
#    layers queued).
# 6. If time is left: end to end in bf16 at B = 1 and 8 with BI_RL_CONCAT_PROJECTIONS=1, which
#    concatenates the sibling projections in off mode too (stock products over the wider
#    weights): off's decode step is host-bound (the host never waits for the device), so
#    fewer launches may be what lets off pass mlx-lm by 1.1x. Off's bits then differ from
#    plain stock's (it stays a stock control); strict's do not change.
# 7. If time is still left: the engine's host phases at bf16 B = 1 (tools/engine_profile.py
#    --phases-only), where the engine's step read 1.17x the bare step in strict mode.
# Copy this and docs/cpu/2026-12-07/s40/score_queue_ab.py to the repository root (docs/ stays
# behind: the tree must travel under 64 MiB); carry [".stage2"].
python3 -P -c "import mlx.core" 2>/dev/null || { bash .stage2/install > /tmp/install.log 2>&1; echo "install rc=$? [$SECONDS s]"; }
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
o=$OUT/n; mkdir -p $o
date -u +%FT%TZ | tee $o/date.txt
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $o/device.txt
git log --oneline -1 > $o/commit.txt 2>/dev/null
xd=""; python3 -P -c "import xdist" 2>/dev/null && xd="-p xdist -n 8"
timeout ${T_TESTS:-200} python3 -P -m pytest -q -p no:cacheprovider $xd tests/test_scorer.py \
  tests/test_queued.py tests/test_policy.py tests/test_concat.py tests/test_rollouts_golden.py \
  > $o/tests.log 2>&1
echo "tests rc=$? [$SECONDS s]"; grep -E "FAILED|passed|failed" $o/tests.log | tail -8
M=/tmp/qwen3-1.7b-e2e
for fill in 0 1; do
  BI_RL_HOPPER_FILL=$fill timeout 100 python3 -P -m bi_rl.cli.bench --only rescore-long -v \
    --repeats 5 --model-dir $M --models bf16 --long-batch 1 --long-length 431 \
    --json $o/rescore-1x431-fill$fill.json > $o/rescore-1x431-fill$fill.log 2>&1
  echo "rescore 1x431 fill=$fill rc=$? [$SECONDS s]"; tail -1 $o/rescore-1x431-fill$fill.log
done
for bs in 1 8 16; do
  timeout 60 python3 -P score_queue_ab.py $M/bf16 64 $bs 150,350 >> $o/score-queue-ab.txt 2>&1
  echo "score queue b$bs rc=$? [$SECONDS s]"
done; grep samples $o/score-queue-ab.txt
timeout 150 python3 -P -m bi_rl.cli.bench --only rescore-long -v --repeats 3 --model-dir $M \
  --models bf16,4-bit --json $o/rescore-long.json > $o/rescore-long.log 2>&1
echo "rescore-long rc=$? [$SECONDS s]"; tail -3 $o/rescore-long.log
left=$(( ${T_ALL:-570} - SECONDS ))
[ $left -gt 60 ] && timeout $left python3 -P -m bi_rl.cli.bench --only e2e -v --repeats 3 \
  --model-dir $M --batches 1,8 --models bf16,4-bit --json $o/e2e.json > $o/e2e.log 2>&1
echo "e2e rc=$? [$SECONDS s]"; grep " B=" $o/e2e.log | tail -4
left=$(( ${T_ALL:-570} - SECONDS ))
[ $left -gt 60 ] && BI_RL_CONCAT_PROJECTIONS=1 timeout $left python3 -P -m bi_rl.cli.bench \
  --only e2e -v --repeats 3 --model-dir $M --batches 1,8 --models bf16 \
  --json $o/e2e-concat-all.json > $o/e2e-concat-all.log 2>&1
echo "e2e concat all rc=$? [$SECONDS s]"; grep " B=" $o/e2e-concat-all.log | tail -2
left=$(( ${T_ALL:-570} - SECONDS ))
[ $left -gt 45 ] && timeout $left python3 -P tools/engine_profile.py --workload qwen3-1.7b \
  --model-dir $M --model bf16 --batch 1 --steps 64 --repeats 3 --phases-only \
  > $o/engine-phases-b1.txt 2>&1
echo "engine phases rc=$? [$SECONDS s]"; tail -6 $o/engine-phases-b1.txt
tar czf $OUT/n.tgz -C $OUT n && rm -rf $o
