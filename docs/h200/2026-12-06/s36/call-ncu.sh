#!/usr/bin/env bash
# Decode-sized products (M = 1, 8, 64) on the 1.7B projections, 4-bit and bf16, and bf16 at
# 4096 x 4096, ours and stock: each kernel's own GPU time by Nsight Compute
# (gpu__time_duration; CLOCK=base locks the clocks, default none), so that bi-bench's per-call ratio (graph building
# included, one weight read back to back from L2) can be split into kernel and host. Twice:
# with ncu's default cache flush before each kernel (weights from memory, as a model's decode
# step reads them) and with the caches kept (as in bi-bench). Carry [".stage2"].
python3 -P -c "import mlx.core" 2>/dev/null || { bash .stage2/install > /tmp/install.log 2>&1; echo "install rc=$?"; }
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
o=$OUT/n-clock-${CLOCK:-none}; mkdir -p $o
date -u +%FT%TZ | tee $o/date.txt
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $o/device.txt
git log -1 --format=%H > $o/commit.txt 2>/dev/null
cases=$(python3 -P -c 'from tools.cuda_profile import CASES; print(" ".join(c for c in CASES if c.split("-m")[0].split("-")[-1] in ("gemm", "qmm") and "x" in c))')
echo $cases > $o/cases.txt
python3 -P tools/cuda_profile.py $cases > $o/warm.log 2>&1; echo "warm-up rc=$? [$SECONDS s]"
for cache in all none; do
  timeout $(( (560 - SECONDS) / 2 )) ncu --clock-control ${CLOCK:-none} --cache-control $cache \
    --metrics gpu__time_duration.sum --csv python3 -P tools/cuda_profile.py $cases \
    > $o/ncu-cache-$cache.csv 2> $o/ncu-cache-$cache.err
  echo "ncu cache $cache rc=$? [$SECONDS s]"; tail -2 $o/ncu-cache-$cache.err
  gzip $o/ncu-cache-$cache.csv
done
