#!/usr/bin/env bash
# For the next device session (README item 1), after arms.sh here and staging (call:
# `bash .stage2/install > /tmp/install.log && bash docs/h200/2026-12-03/s23/next/run.sh`,
# carry .stage2 and .ab): every GPU test file and the full bi-verify sweep, side by side, on
# arm rows (main with rows.patch). Main's tests run against the arm's package and kernels
# (`tools/cuda_device_run.sh` runs python with -P, so PYTHONPATH's arm comes first; its first
# line names the bi_rl it imported). About 8 minutes on a fresh machine.
set -u
ln -sfn "$PWD/bi_rl/assets" .ab/rows/bi_rl/assets
PYTHONPATH=$PWD/.ab/rows T_GPU=${T_GPU:-540} T_SWEEP=${T_SWEEP:-540} \
  bash tools/cuda_device_run.sh "$OUT/checks-rows" checks
