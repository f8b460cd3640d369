#!/usr/bin/env bash
# The kernel tables at the 512-key default on one machine: bi-bench's attention table (the
# decode cells the target names, now with 16384 keys, prefill, windows, head dim 256), then
# the half-type GEMM table, each against stock MLX in the same process. Carry [".stage2"];
# run from the repository root; the quantized table and the engine's profile are
# call-engine.sh's.
bash .stage2/install > /tmp/install.log 2>&1; echo "install rc=$? [$SECONDS s]"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
py="python3 -P"
o=$OUT/t; mkdir -p $o
date -u +%FT%TZ | tee $o/date.txt
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $o/device.txt
for part in attention gemm; do
  timeout ${T_PART:-250} $py -m bi_rl.cli.bench --only $part -v --json $o/$part.json \
    > $o/$part.log 2>&1
  echo "$part rc=$? [$SECONDS s]"; grep -E "MISS|ratio" $o/$part.log | tail -40
done
tar czf $OUT/t.tgz -C $OUT t && rm -rf $o
