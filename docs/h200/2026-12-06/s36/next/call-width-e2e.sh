#!/usr/bin/env bash
# Prepared in the thirty-sixth session, not run: the 17-64-row block width as a whole model
# runs it. End to end on the 1.7B shape in bf16 at batch 64 (decode steps of 64 rows), with
# DECODE's 128 columns and with the width BI_RL_HOPPER_DECODE_COLUMNS names (64 unless
# WIDTH says otherwise), the same bits; the bench's header records the variable. Copy to the
# repository root and carry [".stage2"].
python3 -P -c "import mlx.core" 2>/dev/null || { bash .stage2/install > /tmp/install.log 2>&1; echo "install rc=$? [$SECONDS s]"; }
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
o=$OUT/w; mkdir -p $o
date -u +%FT%TZ | tee $o/date.txt
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $o/device.txt
for width in 128 ${WIDTH:-64}; do
  BI_RL_HOPPER_DECODE_COLUMNS=$width timeout $(( (560 - SECONDS) / (width == 128 ? 2 : 1) )) \
    python3 -P -m bi_rl.cli.bench --only e2e -v --repeats 3 --model-dir /tmp/qwen3-1.7b-e2e \
    --batches 64 --models bf16 --json $o/e2e-width-$width.json > $o/e2e-width-$width.log 2>&1
  echo "width $width rc=$? [$SECONDS s]"; grep "B=64" $o/e2e-width-$width.log | tail -2
done
tar czf $OUT/w.tgz -C $OUT w && rm -rf $o
