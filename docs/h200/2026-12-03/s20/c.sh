#!/usr/bin/env bash
# Call 3 (twentieth session, same machine as a.sh): Nsight Compute (one launch each of ours
# and stock's kernels, five sections) on the attention cells that still miss their targets
# without a profile: decode at batch 1 over 32768 and 131072 keys, and prefill of 16384
# tokens under a 4096-key window; then
# every GPU test file beside the full bi-verify sweep on the checkout (main, with
# row-range.patch applied if a.sh's arm held).
set -u
export PYTHONUNBUFFERED=1
R=$OUT/c; mkdir -p $R
pack() { (cd $OUT && tar czf c.tgz c); }
date -u +%FT%TZ | tee $R/date.txt
git diff --stat >> $R/date.txt
export MLX_PTX_CACHE_DIR=/tmp/mlx-main PYTHONPATH=$PWD
for c in decode1 window; do
  s=$SECONDS
  timeout 100 ncu --profile-from-start off --clock-control none --section SpeedOfLight \
    --section Occupancy --section LaunchStats --section WarpStateStats \
    --section MemoryWorkloadAnalysis python3 tools/attn_profile.py --case $c > $R/ncu-$c.txt 2>&1
  echo "ncu $c rc=$? [$((SECONDS-s)) s]" | tee -a $R/date.txt
  grep -E "^  [a-zA-Z_]|Duration|DRAM Throughput|Achieved Occupancy|Registers Per|Grid Size" $R/ncu-$c.txt | head -40
  pack
done
JOBS=12 VERIFY_JOBS=6 T_GPU=440 T_SWEEP=440 bash tools/cuda_device_run.sh $R checks > $R/checks.txt 2>&1
cat $R/checks.txt | tail -12
pack
