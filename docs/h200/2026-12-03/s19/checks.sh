#!/usr/bin/env bash
# Nineteenth session (after ab.sh and bench.sh on the same machine): main's GPU tests and the
# full bi-verify sweep side by side (`tools/cuda_device_run.sh checks`; the last full sweep ran
# in the fourteenth session, before the prefill attention changes since), with MLX's default
# kernel cache, which the earlier calls did not use. About 6-7 minutes; a call cut at its
# limit resumes the sweep from its log when run again on the same machine.
set -u
export PYTHONUNBUFFERED=1
R=$OUT/n; mkdir -p $R
git log -1 --format=%h > $R/commit.txt 2>/dev/null
JOBS=12 VERIFY_JOBS=6 T_GPU=420 T_SWEEP=420 SWEEP_LOG=/tmp/sweep.log \
  bash tools/cuda_device_run.sh $R checks 2>&1 | tee $R/checks.log | tail -12
cd $OUT && tar czf n.tgz n
