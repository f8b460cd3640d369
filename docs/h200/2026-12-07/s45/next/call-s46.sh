#!/usr/bin/env bash
# Prepared in the forty-fifth session for the next one (never ran). What that session left:
# 1. The GPU tests of the files it changed (test_bench with the tiny workload at head dim 64,
#    test_tools with score_parts' build / submit / wait split), test_concat again, and those
#    of the Hopper GEMM, the Hopper attention and the golden logs under the new default
#    block-shape rule (hopper.fill_enabled; they passed with BI_RL_HOPPER_FILL=1 in the
#    thirty-ninth and fortieth sessions).
# 2. The rows its call did not reach with mode off concatenating by default: 4-bit B = 8 and
#    bf16 B = 1 (off / mlx-lm is the engine issue's figure; B = 1 must not move: one row a
#    step never concatenates).
# 3. Strict rescoring at B = 8 is the device's time (10 ms over off's 37): score_parts with
#    the new split should show it as wait, and bi-bench's rescore-long at 8 x 512 tokens
#    splits strict's extra between the GEMMs and the attention.
# 4. If time is left: the chained GEMM A/B at 300 / 2,400 / 4,848 rows (block shapes at
#    rescoring's row counts; 4,848 is eight 606-token sequences, bi-bench's B = 8 rescoring),
#    which the forty-fourth and forty-fifth sessions' calls never reached. At 4,848 rows a
#    2048-column output makes 304 blocks of 128 x 256 on 132 multiprocessors: three waves,
#    the last 30% full; 128 x 128 blocks make 608 (five waves, the last 60% full).
# Copy this to the repository root; carry [".stage2"]; run as `T_ALL=540 bash call-s46.sh`.
python3 -P -c "import mlx.core" 2>/dev/null || { bash .stage2/install > /tmp/install.log 2>&1; echo "install rc=$? [$SECONDS s]"; }
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
T=${T_ALL:-540}
o=$OUT/n; mkdir -p $o
date -u +%FT%TZ | tee $o/date.txt
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $o/device.txt
python3 -P -c "from bi_rl._source import source_digest; print(source_digest())" > $o/source.txt
M=/tmp/qwen3-1.7b-e2e
xd=""; python3 -P -c "import xdist" 2>/dev/null && xd="-p xdist -n 12"
timeout ${T_TESTS:-150} python3 -P -m pytest -q -p no:cacheprovider $xd -rf --tb=short \
  tests/test_cuda_hopper.py tests/test_cuda_hopper_attention.py tests/test_rollouts_golden.py \
  tests/test_bench.py tests/test_tools.py tests/test_concat.py > $o/tests.log 2>&1
echo "tests rc=$? [$SECONDS s]"; grep -E "^FAILED|passed|failed" $o/tests.log | tail -8
# `bi-bench --quick --only e2e` on the GPU (the tiny workload now at head dim 64): its 4-bit
# rows run stock's quantized matmul at K = 64, which the fifteenth session found failing to
# compile from 16 rows on this CUDA wheel (a missing crt/mma.h); this says whether --quick
# runs there.
timeout 90 python3 -P -m bi_rl.cli.bench --quick --only e2e --json $o/quick-e2e.json \
  > $o/quick-e2e.log 2>&1; echo "quick e2e rc=$? [$SECONDS s]"; tail -3 $o/quick-e2e.log
e2e() {  # name, batches, model
  left=$(( T - SECONDS ))
  [ $left -gt 60 ] || { echo "$1 skipped: no time"; return; }
  timeout $left python3 -P -m bi_rl.cli.bench --only e2e -v --repeats 3 --model-dir $M \
    --batches $2 --models $3 --json $o/$1.json > $o/$1.log 2>&1
  echo "$1 rc=$? [$SECONDS s]"; grep " B=" $o/$1.log | tail -2
}
# 3. The scorer with the rule (the default) against one shape per row range
#    (BI_RL_HOPPER_FILL=0, the `strict-ranges` arm), arms alternating in one process: eight
#    sequences one at a time (0.82x strict's time with the rule in the forty-fifth session,
#    spread 0.53) and eight at a time.
for spec in "1 8" "8 8"; do
  set -- $spec; left=$(( T - SECONDS ))
  [ $left -gt 50 ] && timeout $left python3 -P tools/score_parts.py --model-dir $M --models bf16 \
    --batches $1 --items $2 --repeats 5 --fill --json $o/score-parts-b$1-i$2.json \
    > $o/score-parts-b$1-i$2.log 2>&1; grep "B=" $o/score-parts-b$1-i$2.log 2>/dev/null | tail -1
done
e2e q4-b8 8 4-bit
e2e b1 1 bf16
left=$(( T - SECONDS ))
[ $left -gt 60 ] && timeout $left python3 -P -m bi_rl.cli.bench --only rescore-long -v \
  --repeats 5 --model-dir $M --models bf16 --long-batch 8 --long-length 512 \
  --json $o/rescore-8x512.json > $o/rescore-8x512.log 2>&1; tail -2 $o/rescore-8x512.log
left=$(( T - SECONDS ))
[ $left -gt 70 ] && timeout $left python3 -P tools/hopper_ab.py --chain --ms 300,2400,4848 \
  --configs auto,PREFILL_DEEP_STAGED,MIDDLE,DECODE --only 2048,2048 --only 6144,2048 --only 2048,6144 \
  --rounds 7 > $o/hopper-ab-rescore.jsonl 2> $o/hopper-ab-rescore.log
tar czf $OUT/n.tgz -C $OUT n && rm -rf $o
