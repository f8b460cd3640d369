#!/usr/bin/env bash
# The staged epilogue (PREFILL_STAGED, PREFILL_DEEP_STAGED) on the H200, in one call after
# staging: its GPU tests and the every-configuration comparison (which covers it through
# variants()), then tools/hopper_ab.py against PREFILL_DEEP and PREFILL in one process.
# Outputs under $OUT/s.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=$OUT/s; mkdir -p "$R"
date -u +%FT%TZ | tee "$R/date.txt"
xd=$(python3 -c "import xdist" 2>/dev/null && echo "-p xdist -n 14")
timeout ${T_TESTS:-140} python3 -P -m pytest -q -p no:cacheprovider $xd tests/test_cuda_hopper.py \
  -k "staged or every_configuration_and_batch" > "$R/tests.log" 2>&1
echo "staged tests rc=$?"; tail -2 "$R/tests.log"; grep -E "^(FAILED|ERROR)" "$R/tests.log" | head
timeout ${T_AB:-120} python3 -P tools/hopper_ab.py \
  --configs PREFILL_DEEP,PREFILL_DEEP_STAGED,PREFILL_STAGED,PREFILL > "$R/ab.jsonl" 2> "$R/ab.err"
echo "hopper_ab rc=$?"; cut -c1-200 "$R/ab.jsonl"
date -u +%FT%TZ | tee -a "$R/date.txt"
