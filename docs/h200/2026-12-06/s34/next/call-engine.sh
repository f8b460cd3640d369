#!/usr/bin/env bash
# The quantized table at the 512-key default, then where the engine's 4-bit decode step at
# batch 8 goes beyond the bare model step (the thirty-fourth session measured 1.49x there,
# 1.06x with the mode off): tools/engine_profile.py's layers and host phases on the bench's
# 1.7B-shaped 4-bit model. Carry [".stage2"]; run from the repository root.
bash .stage2/install > /tmp/install.log 2>&1; echo "install rc=$? [$SECONDS s]"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
py="python3 -P"
o=$OUT/q; mkdir -p $o
date -u +%FT%TZ | tee $o/date.txt
timeout ${T_QMM:-280} $py -m bi_rl.cli.bench --only qmm -v --json $o/qmm.json > $o/qmm.log 2>&1
echo "qmm rc=$? [$SECONDS s]"; grep -E "MISS|ratio" $o/qmm.log | tail -30
timeout $((570 - SECONDS)) $py tools/engine_profile.py --model q4 --batch 8 --steps 96 \
  --repeats 3 --model-dir /tmp/q17 --json $o/engine-q4-b8.json > $o/engine-q4-b8.log 2>&1
echo "engine profile rc=$? [$SECONDS s]"; tail -30 $o/engine-q4-b8.log
tar czf $OUT/q.tgz -C $OUT q && rm -rf $o
