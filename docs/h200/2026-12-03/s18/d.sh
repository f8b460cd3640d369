#!/usr/bin/env bash
# Run d (eighteenth session, after run c on the same machine): Nsight Compute of one launch of
# the prefill attention of arm $1 (8192 causal tokens, head dim 128, 16/8 heads) with the full
# set, its details page and its SASS source page with per-instruction stall samples (gzip CSV,
# read by s17/stalls.py).
set -u
export PYTHONUNBUFFERED=1
a=${1:-main}
R=$OUT/d; mkdir -p $R
date -u +%FT%TZ | tee $R/date.txt
s=$SECONDS
MLX_PTX_CACHE_DIR=/tmp/mlx-$a PYTHONPATH=$PWD/.ab/$a timeout 150 ncu --clock-control none --profile-from-start off --set full --import-source no \
  -k regex:bi_hattn -o $R/prefill python3 -P tools/attn_profile.py --case prefill > $R/ncu.log 2>&1
echo "ncu full $a rc=$? [$((SECONDS-s)) s]" | tee -a $R/date.txt; tail -2 $R/ncu.log
if [ -f $R/prefill.ncu-rep ]; then
  ncu -i $R/prefill.ncu-rep --page details > $R/prefill-details.txt 2>&1
  ncu -i $R/prefill.ncu-rep --page source --print-source sass --csv 2>&1 | gzip > $R/prefill-sass.csv.gz || true
  rm -f $R/prefill.ncu-rep
  grep -E "Duration|Executed Ipc A|Registers Per|Warp Cycles Per Issued|No Eligible|Executed Instructions  " $R/prefill-details.txt
fi
