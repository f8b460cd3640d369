#!/usr/bin/env bash
# Thirty-eighth session, the call after call-s38.sh on the same machine: end to end on the
# 1.7B shape in bf16 at batches 1 and 8 (E2E_BATCHES), 3 repeats, with the block-shape rule
# off (the default: DECODE at 17-64 rows, 128 x 256 past them) and on (BI_RL_HOPPER_FILL=1),
# off first: rescoring's products of a few hundred rows a sequence are where bf16 rescoring
# misses its target. Copy to the repository root; carry [".stage2"].
python3 -P -c "import mlx.core" 2>/dev/null || { bash .stage2/install > /tmp/install.log 2>&1; echo "install rc=$? [$SECONDS s]"; }
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
o=$OUT/e; mkdir -p $o
date -u +%FT%TZ | tee $o/date.txt
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $o/device.txt
for fill in 0 1; do
  left=$(( (${T_ALL:-560} - SECONDS) / (fill == 0 ? 2 : 1) ))
  BI_RL_HOPPER_FILL=$fill timeout $left python3 -P -m bi_rl.cli.bench --only e2e -v --repeats 3 \
    --model-dir /tmp/qwen3-1.7b-e2e --batches ${E2E_BATCHES:-1,8} --models bf16 \
    --json $o/e2e-fill$fill.json > $o/e2e-fill$fill.log 2>&1
  echo "e2e fill $fill rc=$? [$SECONDS s]"; grep "bf16 *B=\\|bf16 B=" $o/e2e-fill$fill.log | tail -4
done
tar czf $OUT/e.tgz -C $OUT e && rm -rf $o
