#!/usr/bin/env bash
# Prepared in the forty-sixth session (the attention check) and the forty-seventh (the TMA
# probe), moved here by the forty-eighth; none of the three got a machine; never ran. The
# first device call: nothing staged, no carry, from the repository root:
# `bash docs/h200/2026-12-07/s48/next/call-check.sh` (two or three minutes, then
# compute-sanitizer as time allows). With little device time left, call-min.sh instead.
# 1. The prefill attention's ping-pong schedule against lockstep without MLX: "differ_pp" and
#    "differ_tma" (ping-pong with TMA copies) must be 0 in every line (and "unwritten" 0);
#    speed: "pp/lockstep", "pp_tma/pp".
# 2. Whether a kernel can load through TMA with a tensor map it builds itself (what a kernel
#    launched through MLX would have to do): every "load" line "differ": 0 for the maps
#    "param" (the driver's, the reference), "template" and "device"; then GB/s of one thread's
#    TMA copies against every thread's cp.async. Each check runs in its own process (a map the
#    device rejects faults and ends it).
# 3. The GEMM fed by TMA against the cp.async one past 64 rows, without MLX: "differ" and
#    "unwritten" 0 on every line; speed: "tma/cp_async" (and each against cuBLAS where it loads).
# 4. As the call's time allows (CHECK_T, default 420 s in all): compute-sanitizer's racecheck
#    and synccheck on the small cases of both checks ("quick": bits only), memcheck on the
#    TMA GEMM's; each log should end with "0 hazards" / "0 errors".
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
echo "attn_schedule_check rc=${PIPESTATUS[0]}"
for c in param template device stream; do
  timeout 60 /tmp/tma_probe $c | tee -a $OUT/tma-probe.jsonl
  echo "tma_probe $c rc=${PIPESTATUS[0]}"
done
timeout 120 /tmp/gemm_tma_check | tee $OUT/gemm-tma-check.jsonl
echo "gemm_tma_check rc=${PIPESTATUS[0]}"
san() {  # tool, log name, command...
  local left=$(( ${CHECK_T:-420} - SECONDS ))
  [ $left -gt 30 ] || { echo "sanitizer $2 skipped: no time"; return; }
  timeout $(( left < 120 ? left : 120 )) compute-sanitizer --tool $1 "${@:3}" > $OUT/san-$2.log 2>&1
  echo "sanitizer $2 rc=$? [$SECONDS s]"; tail -2 $OUT/san-$2.log
}
san racecheck attn-race /tmp/attn_schedule_check quick
san racecheck gemm-tma-race /tmp/gemm_tma_check quick
san synccheck attn-sync /tmp/attn_schedule_check quick
san synccheck gemm-tma-sync /tmp/gemm_tma_check quick
san memcheck gemm-tma-mem /tmp/gemm_tma_check quick
