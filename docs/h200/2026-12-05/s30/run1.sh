#!/usr/bin/env bash
# s30 call 2: every GPU test file with concatenation on by default in the mode (Hopper) and
# the wider 4-bit decode blocks; beside them (bit checks only) the attention GPU tests at
# 512- and 1024-key splits; then bi-bench --only qmm; the 1.7B models written alongside.
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
py="python3 -P"
mkdir -p $OUT/g $OUT/q $OUT/s
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/device.txt
date -u +%FT%TZ > $OUT/start.txt
$py -c "from bi_rl import concat; print('concat default sets', concat.chosen_sets(True), 'faster_here', concat.faster_here())" > $OUT/concat-default.txt 2>&1
( timeout 300 $py -c "
from pathlib import Path
from bi_rl.bench import e2e
print(e2e.write_models(e2e.WORKLOADS['qwen3-1.7b'], Path('/tmp/qwen3-1.7b-e2e')))
" > $OUT/models.log 2>&1 ) &
( for s in 512 1024; do
    BI_RL_ATTN_SPLIT=$s timeout 200 $py -m pytest -q -p no:cacheprovider \
      tests/test_cuda_hopper_attention.py > $OUT/s/attn$s-tests.log 2>&1
    echo "rc=$?" >> $OUT/s/attn$s-tests.log
  done ) &
T_GPU=380 JOBS=8 bash tools/cuda_device_run.sh $OUT/g gpu > $OUT/g/run.log 2>&1
date -u +%FT%TZ >> $OUT/g/run.log
wait
timeout 100 $py -m bi_rl.cli.bench --only qmm --json $OUT/q/qmm.json > $OUT/q/qmm.log 2>&1
echo "qmm rc=$?" >> $OUT/q/qmm.log
date -u +%FT%TZ > $OUT/end.txt
