#!/usr/bin/env bash
# Prepared in the thirty-eighth session for the next one. In order, each step cut to the time
# left:
# 1. The Hopper GEMM's and quantized GEMM's GPU tests and the GPU golden logs with
#    BI_RL_HOPPER_FILL=1 (block shapes that follow the output's size, MIDDLE included; the
#    logs must not change); the warp-specialised few-row quantized configurations are in
#    variants(), so the same tests compare them bit for bit, and the dispatcher now picks
#    one (its route through the dispatcher and the CUDA backend's quantized_matmul,
#    test_cuda_qmm.py, runs here for the first time).
# 2. 4-bit at 1, 8 and 16 rows, chained: the dispatcher (now the warp-specialised blocks
#    where it took two-warp ones) against the plain two-warp blocks (n1x2x12) and the
#    one-chain-warp form, on the shapes calls 2-3 of this session did not time
#    (tools/hopper_ab.py --bits 4 --chain).
# 3. The prefill attention at 512-2048 tokens with one and two warpgroups a block, chained
#    (attn_nwg_ab.py, copied to the root).
# 4. Rescoring one 600-token sequence (rows where 128 x 256 GEMM blocks and two-warpgroup
#    attention blocks leave multiprocessors idle) with the block-shape rule off (the
#    default) and on, off first.
# End to end with the rule off and on is call-e2e-s38.sh, the next call on the warm machine.
# Copy this and ../s37/next/attn_nwg_ab.py to the repository root; carry [".stage2"].
python3 -P -c "import mlx.core" 2>/dev/null || { bash .stage2/install > /tmp/install.log 2>&1; echo "install rc=$? [$SECONDS s]"; }
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
o=$OUT/s; mkdir -p $o
date -u +%FT%TZ | tee $o/date.txt
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $o/device.txt
git log -1 --format=%h > $o/commit.txt 2>/dev/null
xd=""; python3 -P -c "import xdist" 2>/dev/null && xd="-p xdist -n 8"
BI_RL_HOPPER_FILL=1 timeout ${T_TESTS:-200} python3 -P -m pytest -q -p no:cacheprovider $xd \
  tests/test_cuda_hopper.py tests/test_cuda_gemm.py tests/test_cuda_qmm.py \
  tests/test_rollouts_golden.py > $o/tests.log 2>&1
echo "tests rc=$? [$SECONDS s]"; grep -E "FAILED|passed|failed" $o/tests.log | tail -8
timeout 70 python3 -P tools/hopper_ab.py --bits 4 --chain --ms 1,8,16 \
  --configs auto,n1x2x12,ws2x1x16x4 --only 2048,12288 --only 2048,4096 --only 2048,1024 \
  > $o/ab-q4-ws-chain.jsonl 2> $o/ab-q4-ws-chain.err
echo "ws ab rc=$? [$SECONDS s]"; cut -c1-260 $o/ab-q4-ws-chain.jsonl; tail -3 $o/ab-q4-ws-chain.err
timeout 40 python3 -P attn_nwg_ab.py 512,600,1024,2048 > $o/attn-nwg-chain.jsonl 2> $o/attn-nwg-chain.err
echo "attn nwg rc=$? [$SECONDS s]"; cat $o/attn-nwg-chain.jsonl; tail -2 $o/attn-nwg-chain.err
for fill in 0 1; do
  left=$(( ${T_ALL:-570} - SECONDS ))
  [ $left -lt 45 ] && break
  BI_RL_HOPPER_FILL=$fill timeout $(( fill == 0 ? left / 2 : left )) python3 -P -m bi_rl.cli.bench \
    --only rescore-long -v --repeats 5 --model-dir /tmp/qwen3-1.7b-e2e --models bf16 \
    --long-batch 1 --long-length 600 --json $o/rescore-1x600-fill$fill.json \
    > $o/rescore-1x600-fill$fill.log 2>&1
  echo "rescore fill $fill rc=$? [$SECONDS s]"; tail -3 $o/rescore-1x600-fill$fill.log
done
tar czf $OUT/s.tgz -C $OUT s && rm -rf $o
