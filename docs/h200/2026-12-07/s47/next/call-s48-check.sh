#!/usr/bin/env bash
# Prepared in the forty-sixth session (the attention check) and the forty-seventh (the TMA
# probe), neither of which got device time; never ran. The first device call: nothing staged,
# no carry, from the repository root: `bash docs/h200/2026-12-07/s47/next/call-s48-check.sh`
# (two or three minutes).
# 1. The prefill attention's ping-pong schedule against lockstep without MLX: "differ_pp" must
#    be 0 in every line (and "unwritten" 0); speed: "pp/lockstep".
# 2. Whether a kernel can load through TMA with a tensor map it builds itself (what a kernel
#    launched through MLX would have to do): every "load" line "differ": 0 for the maps
#    "param" (the driver's, the reference), "template" and "device"; then GB/s of one thread's
#    TMA copies against every thread's cp.async. Each check runs in its own process (a map the
#    device rejects faults and ends it).
# 3. The GEMM fed by TMA against the cp.async one past 64 rows, without MLX: "differ" and
#    "unwritten" 0 on every line; speed: "tma/cp_async" (and each against cuBLAS where it loads).
mkdir -p $OUT
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/device.txt
date -u +%FT%TZ > $OUT/date.txt
nvcc -gencode arch=compute_90a,code=sm_90a -O3 -std=c++17 -o /tmp/attn_schedule_check \
  tools/attn_schedule_check.cu > $OUT/build.log 2>&1 || { tail -20 $OUT/build.log; exit 1; }
nvcc -gencode arch=compute_90a,code=sm_90a -O3 -std=c++17 -o /tmp/tma_probe \
  tools/tma_probe.cu > $OUT/build-tma.log 2>&1 || tail -20 $OUT/build-tma.log
nvcc -gencode arch=compute_90a,code=sm_90a -O3 -std=c++17 -o /tmp/gemm_tma_check \
  tools/gemm_tma_check.cu -ldl > $OUT/build-gemm-tma.log 2>&1 || tail -20 $OUT/build-gemm-tma.log
timeout 150 /tmp/attn_schedule_check | tee $OUT/attn-schedule-check.jsonl
for c in param template device stream; do
  timeout 60 /tmp/tma_probe $c | tee -a $OUT/tma-probe.jsonl
  echo "tma_probe $c rc=${PIPESTATUS[0]}"
done
timeout 120 /tmp/gemm_tma_check | tee $OUT/gemm-tma-check.jsonl
echo "gemm_tma_check rc=${PIPESTATUS[0]}"
