#!/usr/bin/env bash
# The attention split size (512 keys) with the planner counting splits a block in keys: the
# attention GPU tests at 512 (every splits-a-block value it can pick: 1, 2, 8), then the
# attention table at 256 and 512, two rounds in turn. Everything tarred (a call returns at
# most eight files). Carry [".stage2"]; run from the repository root.
bash .stage2/install > /tmp/install.log 2>&1; echo "install rc=$?"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
mkdir -p $OUT/s
SPLITS=512 T_SPLIT_TESTS=${T_SPLIT_TESTS:-200} ROUNDS=${ROUNDS:-2} T_SPLIT_BENCH=${T_SPLIT_BENCH:-90} \
  JOBS=8 bash tools/cuda_device_run.sh $OUT/s split
tail -20 /tmp/install.log > $OUT/s/install_tail.log
tar czf $OUT/s.tgz -C $OUT s && rm -rf $OUT/s
