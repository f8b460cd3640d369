#!/usr/bin/env bash
# Prepared in the forty-sixth session for the next one; never ran. The first device call: the
# prefill attention's ping-pong schedule against lockstep without MLX (nothing staged, no
# carry), from the repository root: `bash docs/h200/2026-12-07/s46/next/call-s47-check.sh`.
# Bits: "differ_pp" must be 0 in every line (and "unwritten" 0); speed: "pp/lockstep".
mkdir -p $OUT
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/device.txt
date -u +%FT%TZ > $OUT/date.txt
nvcc -gencode arch=compute_90a,code=sm_90a -O3 -std=c++17 -o /tmp/attn_schedule_check \
  tools/attn_schedule_check.cu > $OUT/build.log 2>&1 || { tail -20 $OUT/build.log; exit 1; }
timeout 150 /tmp/attn_schedule_check | tee $OUT/attn-schedule-check.jsonl
