#!/usr/bin/env bash
# Call 2 of the twenty-first session's third machine: q.sh again after the fix of a compile
# error on the device's NVRTC (min() of two long longs is a host function there), trimmed to
# what the budget left: the GPU tests, bi-bench --only qmm on this tree (the base arm's run
# is q.sh's), and Nsight Compute's instruction counts and duration at M = 1, K = 6144,
# N = 2048.
set -u
export PYTHONUNBUFFERED=1 BI_RL_CUDA_CACHE=/tmp/nv-new PYTHONPATH=$PWD
R=$OUT/q2; mkdir -p $R
pack() { (cd $OUT && tar czf q2.tgz q2); }
date -u +%FT%TZ | tee $R/date.txt
s=$SECONDS
timeout 150 python3 -m pytest -q -p no:cacheprovider -n 14 \
  tests/test_cuda_hopper.py tests/test_cuda_qmm.py -k "quantized or qmm" > $R/tests.log 2>&1
echo "tests rc=$? [$((SECONDS-s)) s]" | tee -a $R/date.txt
tail -1 $R/tests.log; grep -E "^(FAILED|ERROR)" $R/tests.log | head -8
pack
s=$SECONDS
timeout 80 python3 -P -m bi_rl.cli.bench --only qmm -v --json $R/qmm-new.json > $R/qmm-new.log 2>&1
echo "bench new rc=$? [$((SECONDS-s)) s]" | tee -a $R/date.txt
grep -E "^qmm 4-bit g64 M=(1|8) K=" $R/qmm-new.log
pack
timeout 40 ncu --clock-control none -k regex:qmm --launch-skip 2 --launch-count 1 \
  --metrics gpu__time_duration.sum,smsp__inst_executed.sum \
  python3 tools/cuda_profile.py qmm-m1-down > $R/ncu-time-new.txt 2>&1
grep -E "duration|inst_executed" $R/ncu-time-new.txt
timeout 50 ncu --set full --import-source no --page source --print-source sass --clock-control none \
  -k regex:qmm --launch-skip 2 --launch-count 1 python3 tools/cuda_profile.py qmm-m1-down \
  > $R/ncu-sass.txt 2>&1
echo "ncu rc=$?"; sed -n '/^0x/p' $R/ncu-sass.txt | cut -c1-125 > $R/sass.txt; rm -f $R/ncu-sass.txt
pack
