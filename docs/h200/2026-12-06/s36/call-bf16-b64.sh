#!/usr/bin/env bash
# End to end on the 1.7B shape in bf16 at batch 64 (the row the scorer's per-piece
# evaluation let an 80 GB card score), then long-context rescoring (4 x 8192 tokens) on the
# same model files. Carry [".stage2"] (the install is skipped where a warm machine has it).
python3 -P -c "import mlx.core" 2>/dev/null || { bash .stage2/install > /tmp/install.log 2>&1; echo "install rc=$?"; }
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
mkdir -p $OUT/e
date -u +%FT%TZ | tee $OUT/e/date.txt
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/e/device.txt
E2E_MODELS=bf16 BATCHES=64 T_E2E17=$((420 - SECONDS)) T_LONG=$((570 - 420)) REPEATS=3 \
  bash tools/cuda_device_run.sh $OUT/e e2e17
tar czf $OUT/e.tgz -C $OUT e && rm -rf $OUT/e
