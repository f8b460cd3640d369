#!/usr/bin/env bash
# End to end on the 1.7B shape, one model a call (E2E_MODELS=bf16, then 4-bit), batches 1,
# 8 and 64, 3 repeats; the bench saves its JSON after every row, so a cut call keeps the
# rows it finished. Long-context rescoring after it on the same model files. Carry
# [".stage2"] (or leave the install out on a machine that still has it).
bash .stage2/install > /tmp/install.log 2>&1; echo "install rc=$?"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
mkdir -p $OUT/e
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader
E2E_MODELS=${E2E_MODELS:-bf16} T_E2E17=${T_E2E17:-420} T_LONG=${T_LONG:-120} \
  BATCHES=${BATCHES:-1,8,64} REPEATS=${REPEATS:-3} bash tools/cuda_device_run.sh $OUT/e e2e17
tar czf $OUT/e.tgz -C $OUT e && rm -rf $OUT/e
