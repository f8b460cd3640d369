#!/usr/bin/env bash
# Call 2 of the twenty-first session's fourth machine, on the last of the device budget: the
# few-row quantized kernel after its k-tile's tail case moved from a generic lambda (which the
# device's NVRTC refuses as a host function) into a template function: its GPU bit tests
# against the wgmma kernel, then Nsight Compute's duration and executed instructions at M = 1,
# K = 6144, N = 2048 (q.sh measured the kernel before this change there), then bi-bench
# --only qmm while time is left.
set -u
export PYTHONUNBUFFERED=1 BI_RL_CUDA_CACHE=/tmp/nv-new PYTHONPATH=$PWD
R=$OUT/q3; mkdir -p $R
pack() { (cd $OUT && tar czf q3.tgz q3); }
date -u +%FT%TZ | tee $R/date.txt
s=$SECONDS
timeout 100 python3 -m pytest -q -p no:cacheprovider -n 14 tests/test_cuda_hopper.py \
  -k "few_row_quantized_kernel_has or one_quantized_launch" > $R/tests.log 2>&1
echo "tests rc=$? [$((SECONDS-s)) s]" | tee -a $R/date.txt
tail -1 $R/tests.log; grep -E "^(FAILED|ERROR)" $R/tests.log | head -8
pack
timeout 30 ncu --clock-control none -k regex:qmm --launch-skip 2 --launch-count 1 \
  --metrics gpu__time_duration.sum,smsp__inst_executed.sum \
  python3 tools/cuda_profile.py qmm-m1-down > $R/ncu-time-new.txt 2>&1
grep -E "duration|inst_executed" $R/ncu-time-new.txt
pack
timeout 60 python3 -P -m bi_rl.cli.bench --only qmm -v --json $R/qmm-new.json > $R/qmm-new.log 2>&1
echo "bench rc=$?"; grep -E "^qmm 4-bit g64 M=(1|8) K=" $R/qmm-new.log
pack
