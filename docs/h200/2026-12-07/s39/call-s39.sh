#!/usr/bin/env bash
# Thirty-ninth session: the thirty-eighth session's call-s38.sh with its rescoring step (which
# call-e2e-s38.sh's rescoring rows cover) replaced by two timings of pipeline depth (step 4).
# Each step cut to the time left, run in the order 1, 4, 3, 2 (the timings new in this
# session first):
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
# 4. One row, chained: what bounds the few-row kernels. ncu (thirty-sixth session, each
#    kernel alone) put the bf16 one at 16 us for 6144 x 2048 at one row, 1.6 TB/s: about what
#    132 multiprocessors with 11 k-tiles of 2 KiB each in flight can stream at a memory
#    latency near 1.5 us. So: the bf16 kernel at 12 stages (the default), 24 and 32; the
#    warp-specialised 4-bit one (16 stages, 4 helpers: 12 k-tiles of about 0.6 KiB ahead,
#    the default) at 32 and 64 stages, and with 8 helpers and 8 slots at 32; on the narrow
#    1.7B and 8B projections.
# End to end with the rule off and on is call-e2e-s38.sh, the next call on the warm machine.
# Copy this and ../../2026-12-06/s37/next/attn_nwg_ab.py to the repository root; carry
# [".stage2"].
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
timeout 60 python3 -P tools/hopper_ab.py --bits 4 --chain --ms 1 \
  --configs auto,ws1x2x32x4,ws1x2x64x4,ws1x2x32x8x8 --only 2048,2048 --only 6144,2048 --only 14336,4096 \
  > $o/ab-q4-depth.jsonl 2> $o/ab-q4-depth.err
echo "q4 depth rc=$? [$SECONDS s]"; cut -c1-300 $o/ab-q4-depth.jsonl; tail -3 $o/ab-q4-depth.err
timeout 60 python3 -P tools/hopper_ab.py --chain --ms 1,8 \
  --configs auto,n1x2x24,n1x2x32 --only 2048,2048 --only 6144,2048 --only 2048,6144 \
  > $o/ab-bf16-depth.jsonl 2> $o/ab-bf16-depth.err
echo "bf16 depth rc=$? [$SECONDS s]"; cut -c1-300 $o/ab-bf16-depth.jsonl; tail -3 $o/ab-bf16-depth.err
timeout 40 python3 -P attn_nwg_ab.py 512,600,1024,2048 > $o/attn-nwg-chain.jsonl 2> $o/attn-nwg-chain.err
echo "attn nwg rc=$? [$SECONDS s]"; cat $o/attn-nwg-chain.jsonl; tail -2 $o/attn-nwg-chain.err
timeout 70 python3 -P tools/hopper_ab.py --bits 4 --chain --ms 1,8,16 \
  --configs auto,n1x2x12,ws2x1x16x4 --only 2048,12288 --only 2048,4096 --only 2048,1024 \
  > $o/ab-q4-ws-chain.jsonl 2> $o/ab-q4-ws-chain.err
echo "ws ab rc=$? [$SECONDS s]"; cut -c1-260 $o/ab-q4-ws-chain.jsonl; tail -3 $o/ab-q4-ws-chain.err
tar czf $OUT/s.tgz -C $OUT s && rm -rf $o
