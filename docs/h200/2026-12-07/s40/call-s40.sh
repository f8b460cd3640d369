#!/usr/bin/env bash
# Prepared in the thirty-ninth session for the next one. Each step cut to the time left:
# 1. tests/test_cuda_hopper.py on the GPU: the grouped quantized test now forces only the
#    configurations the grouped entry takes (in the thirty-ninth session it forced the
#    warp-specialised one through the plain grouped body: 19 cases differed).
# 2. Strict rescoring of one sequence of 431 tokens (the end-to-end rows' batch-1 length; its
#    last 64 scored) split between GEMMs and attention (bi-bench --only rescore-long), then
#    rescore_b1.py: the end-to-end call in both modes and a cProfile of strict's. That call
#    took 16-21 ms strict against 11-12 ms off, with no gain from BI_RL_HOPPER_FILL=1
#    beyond one-repeat noise; its GEMMs are about 1.2 TFLOP.
# 3. The prefill attention at 512-2048 tokens with one and two warpgroups a block, chained
#    (attn_nwg_ab.py, its bit comparison fixed).
# 4. The scorer with and without pipelined batches (95f9b4f) on the 1.7B shape in bf16: 64
#    samples of 150-350 prompt tokens, batches of 1 and 16 (docs/cpu/2026-12-07's
#    score_pipeline_ab.py).
# 5. Whether queuing a scoring pass's layers as they are built (mx.async_eval every 1 or 4
#    layers) shortens one batch's rescoring at B = 1 and 8 (eager_layers_ab.py; the bits
#    checked by digest). If it pays, the scorer can do it; nothing in bi_rl does yet.
# 6. End to end in 4-bit at batches 1 and 8 (the warp-specialised few-row kernel, the
#    dispatcher's pick since the thirty-eighth session, has not run end to end).
# Copy this, attn_nwg_ab.py, rescore_b1.py, eager_layers_ab.py and
# docs/cpu/2026-12-07/score_pipeline_ab.py to the repository root (docs/ stays behind: the
# tree must travel under 64 MiB), write the old scorer beside the new (`git show
# 02d83cb:bi_rl/score/scorer.py > bi_rl/score/_scorer_old.py`: untracked, it travels with the
# working tree; the device's git history may not hold that commit); carry [".stage2"].
python3 -P -c "import mlx.core" 2>/dev/null || { bash .stage2/install > /tmp/install.log 2>&1; echo "install rc=$? [$SECONDS s]"; }
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
o=$OUT/n; mkdir -p $o
date -u +%FT%TZ | tee $o/date.txt
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $o/device.txt
xd=""; python3 -P -c "import xdist" 2>/dev/null && xd="-p xdist -n 8"
timeout ${T_TESTS:-240} python3 -P -m pytest -q -p no:cacheprovider $xd tests/test_cuda_hopper.py \
  > $o/tests.log 2>&1
echo "tests rc=$? [$SECONDS s]"; grep -E "FAILED|passed|failed" $o/tests.log | tail -8
timeout 150 python3 -P -m bi_rl.cli.bench --only rescore-long -v --repeats 5 \
  --model-dir /tmp/qwen3-1.7b-e2e --models bf16 --long-batch 1 --long-length 431 \
  --json $o/rescore-1x431.json > $o/rescore-1x431.log 2>&1
echo "rescore-long rc=$? [$SECONDS s]"; tail -3 $o/rescore-1x431.log
timeout 60 python3 -P rescore_b1.py /tmp/qwen3-1.7b-e2e/bf16 > $o/rescore-b1.txt 2>&1
echo "rescore_b1 rc=$? [$SECONDS s]"; head -3 $o/rescore-b1.txt
timeout 40 python3 -P attn_nwg_ab.py 512,600,1024,2048 > $o/attn-nwg-chain.jsonl 2> $o/attn-nwg-chain.err
echo "attn nwg rc=$? [$SECONDS s]"; cat $o/attn-nwg-chain.jsonl; tail -2 $o/attn-nwg-chain.err
for bs in 1 16; do
  timeout 60 python3 -P score_pipeline_ab.py /tmp/qwen3-1.7b-e2e/bf16 64 $bs 150,350 \
    >> $o/score-pipeline-ab.txt 2>&1
  echo "score pipeline b$bs rc=$? [$SECONDS s]"
done; cat $o/score-pipeline-ab.txt | grep samples
timeout 90 python3 -P eager_layers_ab.py /tmp/qwen3-1.7b-e2e/bf16 > $o/eager-layers.txt 2>&1
echo "eager layers rc=$? [$SECONDS s]"; grep "B=" $o/eager-layers.txt
left=$(( ${T_ALL:-570} - SECONDS ))
[ $left -gt 60 ] && timeout $left python3 -P -m bi_rl.cli.bench --only e2e -v --repeats 3 \
  --model-dir /tmp/qwen3-1.7b-e2e --batches 1,8 --models 4-bit --json $o/e2e-4bit.json \
  > $o/e2e-4bit.log 2>&1
echo "e2e 4-bit rc=$? [$SECONDS s]"; grep "4-bit B=" $o/e2e-4bit.log | tail -2
tar czf $OUT/n.tgz -C $OUT n && rm -rf $o
