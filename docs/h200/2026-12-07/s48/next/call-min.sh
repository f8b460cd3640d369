#!/usr/bin/env bash
# The minimal device check when little device time is left: the three offline-built checks,
# the TMA probe first (the foundation of the other two), no sanitizer.
mkdir -p $OUT
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/device.txt
date -u +%FT%TZ > $OUT/date.txt
b() { nvcc -gencode arch=compute_90a,code=sm_90a -O3 -std=c++17 -o /tmp/$1 tools/$1.cu -ldl \
  > $OUT/build-$1.log 2>&1 || tail -5 $OUT/build-$1.log; }
b tma_probe & b gemm_tma_check & b attn_schedule_check & wait
echo "built [$SECONDS s]"
for c in param template device stream; do
  timeout 40 /tmp/tma_probe $c | tee -a $OUT/tma-probe.jsonl | cut -c1-300
  echo "tma_probe $c rc=${PIPESTATUS[0]} [$SECONDS s]"
done
timeout 60 /tmp/gemm_tma_check | tee $OUT/gemm-tma-check.jsonl
echo "gemm_tma_check rc=${PIPESTATUS[0]} [$SECONDS s]"
timeout 90 /tmp/attn_schedule_check | tee $OUT/attn-schedule-check.jsonl
echo "attn_schedule_check rc=${PIPESTATUS[0]} [$SECONDS s]"
