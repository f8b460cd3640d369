#!/usr/bin/env bash
# Prepared in the thirty-seventh session, not run (no machine could be started after its
# first calls). Block shapes that follow the output's size (hopper.filling, opt-in with
# BI_RL_HOPPER_FILL=1): the Hopper GEMM's GPU tests and the GPU golden logs with the rule on
# (every configuration bit for bit, MIDDLE included; the logs must not change); the prefill
# attention at 512-2048 tokens with one and two warpgroups a block, chained (attn_nwg_ab.py,
# copied to the root); rescoring one 600-token sequence (rows where 128 x 256 blocks leave
# multiprocessors idle), then end to end at batch 64 (decode steps of 64 rows), each with
# the rule off (the default: DECODE at 17-64 rows, 128 x 256 past them) and on, off first;
# then, in the time left, 4-bit blocks of one warpgroup against the dispatcher's past 64
# rows, chained. Copy this and attn_nwg_ab.py to the repository root; carry [".stage2"].
python3 -P -c "import mlx.core" 2>/dev/null || { bash .stage2/install > /tmp/install.log 2>&1; echo "install rc=$? [$SECONDS s]"; }
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
o=$OUT/f; mkdir -p $o
date -u +%FT%TZ | tee $o/date.txt
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $o/device.txt
BI_RL_HOPPER_FILL=1 timeout ${T_TESTS:-170} python3 -P -m pytest -q -p no:cacheprovider -p xdist -n 8 \
  tests/test_cuda_hopper.py ${MORE_TESTS:-tests/test_cuda_gemm.py tests/test_rollouts_golden.py} > $o/tests.log 2>&1
echo "tests rc=$? [$SECONDS s]"; tail -4 $o/tests.log
[ $(( ${T_ALL:-570} - SECONDS )) -gt 40 ] && timeout 40 python3 -P attn_nwg_ab.py 512,600,1024,2048 > $o/attn-nwg-chain.jsonl 2> $o/attn-nwg-chain.err
echo "attn nwg rc=$? [$SECONDS s]"; cat $o/attn-nwg-chain.jsonl; tail -2 $o/attn-nwg-chain.err
for fill in 0 1; do
  [ $(( ${T_ALL:-570} - SECONDS )) -lt 45 ] && break
  BI_RL_HOPPER_FILL=$fill timeout $(( (${T_ALL:-570} - SECONDS) / (fill == 0 ? 2 : 1) )) python3 -P -m bi_rl.cli.bench --only rescore-long -v \
    --repeats 5 --model-dir /tmp/qwen3-1.7b-e2e --models bf16 --long-batch 1 --long-length 600 \
    --json $o/rescore-1x600-fill$fill.json > $o/rescore-1x600-fill$fill.log 2>&1
  echo "rescore fill $fill rc=$? [$SECONDS s]"; tail -3 $o/rescore-1x600-fill$fill.log
done
for fill in 0 1; do
  [ $(( ${T_ALL:-570} - SECONDS )) -lt 150 ] && break
  left=$(( (${T_ALL:-570} - 30 - SECONDS) / (fill == 0 ? 2 : 1) ))
  BI_RL_HOPPER_FILL=$fill timeout $left python3 -P -m bi_rl.cli.bench --only e2e -v --repeats 3 \
    --model-dir /tmp/qwen3-1.7b-e2e --batches 64 --models bf16 \
    --json $o/e2e-b64-fill$fill.json > $o/e2e-b64-fill$fill.log 2>&1
  echo "e2e fill $fill rc=$? [$SECONDS s]"; grep "bf16 B=" $o/e2e-b64-fill$fill.log; tail -3 $o/e2e-b64-fill$fill.log
done
left=$(( ${T_ALL:-570} + 25 - SECONDS ))
if [ $left -gt 20 ]; then
  timeout $left python3 -P tools/hopper_ab.py --bits 4 --chain --ms 128,512,1024 \
    --configs auto,128x1x8-r64,64x1x8-r64 > $o/ab-q4-wide-chain.jsonl 2> $o/ab-q4-wide-chain.err
  echo "q4 ab rc=$? [$SECONDS s]"; cut -c1-220 $o/ab-q4-wide-chain.jsonl
fi
tar czf $OUT/f.tgz -C $OUT f && rm -rf $o
