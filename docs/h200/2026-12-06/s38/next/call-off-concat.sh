#!/usr/bin/env bash
# Sibling projections concatenated outside the mode too. `--mode off` runs stock MLX's kernels
# and, by default, one product per projection, as mlx-lm does, so its decode step is mlx-lm's
# (off / mlx-lm 0.94-1.06). With BI_RL_CONCAT_PROJECTIONS=1 both modes take q/k/v and gate/up
# as one product each over their concatenated weights: stock's GEMM over wider outputs, fewer
# launches. End to end on the 1.7B shape in bf16 at batches 8 and 64, 3 repeats, the variable
# unset (the default) then 1; the bench's header records it. Copy to the repository root and
# carry [".stage2"].
python3 -P -c "import mlx.core" 2>/dev/null || { bash .stage2/install > /tmp/install.log 2>&1; echo "install rc=$? [$SECONDS s]"; }
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
o=$OUT/oc; mkdir -p $o
date -u +%FT%TZ | tee $o/date.txt
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $o/device.txt
for cat in unset 1; do
  if [ $cat = 1 ]; then export BI_RL_CONCAT_PROJECTIONS=1; fi
  timeout $(( (${T_ALL:-560} - SECONDS) / (cat == 1 ? 1 : 2) )) python3 -P -m bi_rl.cli.bench \
    --only e2e -v --repeats 3 --model-dir /tmp/qwen3-1.7b-e2e --batches ${E2E_BATCHES:-8,64} \
    --models bf16 --json $o/e2e-concat-$cat.json > $o/e2e-concat-$cat.log 2>&1
  echo "concat $cat rc=$? [$SECONDS s]"; grep "bf16 B=" $o/e2e-concat-$cat.log | tail -4
done
tar czf $OUT/oc.tgz -C $OUT oc && rm -rf $o
