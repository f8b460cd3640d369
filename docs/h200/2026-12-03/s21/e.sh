#!/usr/bin/env bash
# Call 3 of the twenty-first session, after next/run.sh of the twentieth: end to end on the
# 1.7B shape at batches 1 and 8 (bf16 and 4-bit, models written to /tmp/q17 if missing), with
# mlx-lm's batch_generate beside it: the first run with the few-row quantized GEMM (f63f114).
# Then the few-row quantized kernel at M = 1, K = 6144, N = 2048 (the 1.7B down projection)
# under Nsight Compute's full set, and the SASS of its cubin for the k-tile loop.
set -u
export PYTHONUNBUFFERED=1 BI_RL_CUDA_CACHE=/tmp/nvrtc
R=$OUT/e; mkdir -p $R
pack() { (cd $OUT && tar czf e.tgz e); }
date -u +%FT%TZ | tee $R/date.txt
s=$SECONDS
timeout 380 python3 -m bi_rl.cli.bench --only e2e -v --repeats 3 --model-dir /tmp/q17 \
  --batches 1,8 --json $R/e2e-1-8.json > $R/e2e-1-8.log 2>&1
echo "e2e rc=$? [$((SECONDS-s)) s]"; tail -16 $R/e2e-1-8.log
pack
s=$SECONDS
timeout 90 ncu --set full --clock-control none -k regex:bi_hopper_qmm --launch-skip 2 \
  --launch-count 1 python3 tools/cuda_profile.py qmm-m1-down > $R/ncu-qmm-down.txt 2>&1
echo "ncu rc=$? [$((SECONDS-s)) s]"
grep -E "bi_hopper|Duration|DRAM Throughput|Memory Throughput|Executed Ipc|Registers|Achieved Occ|Warp Cycles Per Issued" $R/ncu-qmm-down.txt | head -20
for f in /tmp/nvrtc/bi_hopper_qmm_n-*.cubin; do
  cuobjdump -sass "$f" > $R/sass-$(basename "$f" .cubin).txt 2>&1
done
ls -la /tmp/nvrtc | grep qmm_n; wc -l $R/sass-*.txt
pack
