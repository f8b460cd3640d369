#!/usr/bin/env bash
# The 112- and 96-column GEMM blocks (hopper.BALANCED, variants only): their bits against
# every other configuration (the Hopper GEMM GPU tests that compare variants), then their
# time against the dispatcher's pick (DECODE's 128 columns at 17-64 rows) on the projections
# where 128 columns leave multiprocessors idle (14336 and 12288 columns) and two where they
# do not (controls). Carry [".stage2"]; run from the repository root.
bash .stage2/install > /tmp/install.log 2>&1; echo "install rc=$? [$SECONDS s]"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
py="python3 -P"
o=$OUT/b; mkdir -p $o
date -u +%FT%TZ | tee $o/date.txt
timeout 240 $py -m pytest -q -p no:cacheprovider tests/test_cuda_hopper.py \
  -k "every_configuration_and_batch or operand_forms or balanced" > $o/tests.log 2>&1
echo "tests rc=$? [$SECONDS s]"; tail -3 $o/tests.log
for kn in 4096,14336 2048,12288 2048,6144 4096,4096; do
  timeout 120 $py tools/hopper_ab.py --configs auto,112x1x8,96x1x8 --ms 17,32,64 --rounds 9 \
    --only $kn > $o/ab-${kn/,/x}.jsonl 2> $o/ab-${kn/,/x}.err
  echo "ab $kn rc=$? [$SECONDS s]"; cat $o/ab-${kn/,/x}.jsonl | cut -c1-300
done
tar czf $OUT/b.tgz -C $OUT b && rm -rf $o
