#!/usr/bin/env bash
# The scorer's per-piece evaluation (f0d4110) on the GPU: the scorer's and the fused draw's
# GPU tests, then bf16 end to end at batch 64, the row an 80 GB H100 could not score before
# it. Carry [".stage2"]; run from the repository root.
bash .stage2/install > /tmp/install.log 2>&1; echo "install rc=$? [$SECONDS s]"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
py="python3 -P"
o=$OUT/s; mkdir -p $o
date -u +%FT%TZ | tee $o/date.txt
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $o/device.txt
git log -1 --format=%H > $o/commit.txt 2>/dev/null
xd=""; $py -c "import xdist" 2>/dev/null && xd="-p xdist -n 8"
timeout 150 $py -m pytest -q -p no:cacheprovider $xd tests/test_scorer.py tests/test_cuda_sample.py \
  tests/test_cli_rescore.py > $o/tests.log 2>&1
echo "tests rc=$? [$SECONDS s]"; grep -E "passed|failed|FAILED|Error" $o/tests.log | tail -12
mkdir -p $o/e
E2E_MODELS=bf16 BATCHES=64 T_E2E17=$((560 - SECONDS)) T_LONG=1 bash tools/cuda_device_run.sh $o/e e2e17
tar czf $OUT/s.tgz -C $OUT s && rm -rf $o
