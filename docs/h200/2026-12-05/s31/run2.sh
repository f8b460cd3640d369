#!/usr/bin/env bash
# call 2: install the staged wheel, then end to end on the Qwen3-1.7B shape, everything tarred.
bash .stage2/install > /tmp/install.log 2>&1; echo "install rc=$?"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader
mkdir -p $OUT/e
T_E2E17=${T_E2E17:-430} T_LONG=${T_LONG:-120} BATCHES=${BATCHES:-1,8,64} REPEATS=${REPEATS:-3} \
  bash tools/cuda_device_run.sh $OUT/e e2e17
tail -30 /tmp/install.log > $OUT/e/install_tail.log
tar czf $OUT/e.tgz -C $OUT e && rm -rf $OUT/e
