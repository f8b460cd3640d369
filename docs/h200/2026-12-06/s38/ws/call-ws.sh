#!/usr/bin/env bash
# Call 2 of the thirty-eighth session (01:15 UTC, the machine's first after sixteen failed
# starts), as it ran from the repository root at a9f3e67's tree, carry [".stage2"]: the GPU
# tests that compare every quantized configuration (the warp-specialised ones included) bit
# for bit, then 4-bit at 1 and 8 rows, chained, the dispatcher's few-row blocks (auto) against
# the warp-specialised ones.
bash .stage2/install > /tmp/install.log 2>&1; echo "install rc=$? [$SECONDS s]"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1; o=$OUT/w; mkdir -p $o
date -u +%FT%TZ | tee $o/date.txt
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $o/device.txt
xd=""; python3 -P -c "import xdist" 2>/dev/null && xd="-p xdist -n 12"
timeout 120 python3 -P -m pytest -q -p no:cacheprovider $xd tests/test_cuda_hopper.py \
  -k "warp_specialised or few_row_quantized_kernel_has or quantized_every_configuration or s_q_plus_b" \
  > $o/tests.log 2>&1
echo "tests rc=$? [$SECONDS s]"; grep -E "FAILED|passed|failed|Error" $o/tests.log | tail -8
timeout $((225 - SECONDS)) python3 -P tools/hopper_ab.py --bits 4 --chain --ms 1,8 --rounds 5 \
  --configs auto,ws1x2x16x4,ws2x1x16x4 --only 2048,2048 --only 6144,2048 --only 2048,6144 \
  > $o/ab-q4-ws-chain.jsonl 2> $o/ab-q4-ws-chain.err
echo "ab rc=$? [$SECONDS s]"; cut -c1-400 $o/ab-q4-ws-chain.jsonl; tail -3 $o/ab-q4-ws-chain.err
