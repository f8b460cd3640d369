#!/usr/bin/env bash
# The scorer's GPU tests with the bounded-memory test at head dim 64, then bi-bench's
# attention and half-type GEMM tables at the 512-key default, each against stock MLX in the
# same process. Carry [".stage2"]; run from the repository root.
bash .stage2/install > /tmp/install.log 2>&1; echo "install rc=$? [$SECONDS s]"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
py="python3 -P"
o=$OUT/a; mkdir -p $o
date -u +%FT%TZ | tee $o/date.txt
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $o/device.txt
xd=""; $py -c "import xdist" 2>/dev/null && xd="-p xdist -n 8"
timeout 110 $py -m pytest -q -p no:cacheprovider $xd tests/test_scorer.py > $o/tests.log 2>&1
echo "tests rc=$? [$SECONDS s]"; grep -E "passed|failed|FAILED|Error" $o/tests.log | tail -6
for part in attention gemm; do
  timeout $(( (575 - SECONDS) / ${left:-2} )) $py -m bi_rl.cli.bench --only $part -v \
    --json $o/$part.json > $o/$part.log 2>&1
  echo "$part rc=$? [$SECONDS s]"; grep -E "MISS|ratio" $o/$part.log | tail -30; left=1
done
tar czf $OUT/a.tgz -C $OUT a && rm -rf $o
