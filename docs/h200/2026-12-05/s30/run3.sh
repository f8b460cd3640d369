#!/usr/bin/env bash
# s30 call 4 (fresh machine): the fusion and concat GPU tests after the fix, the one
# quantized-configuration test the last call's limit cut, bi-bench --only qmm, then the 1.7B
# end-to-end bench (peer column) with concatenation and the wider 4-bit blocks by default.
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
py="python3 -P"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/device.txt
( timeout 300 $py -c "
from pathlib import Path
from bi_rl.bench import e2e
print(e2e.write_models(e2e.WORKLOADS['qwen3-1.7b'], Path('/tmp/qwen3-1.7b-e2e')))
" > $OUT/models.log 2>&1 ) &
date -u +%FT%TZ > $OUT/tests.log
timeout 150 $py -m pytest -v -p no:cacheprovider -p xdist -n 8 tests/test_fusion.py tests/test_concat.py \
  "tests/test_cuda_hopper.py::test_quantized_every_configuration_and_batch_gives_the_same_bits" >> $OUT/tests.log 2>&1
echo "tests rc=$? $(date -u +%FT%TZ)" >> $OUT/tests.log
tail -1 $OUT/tests.log | head -c 300
timeout 80 $py -m bi_rl.cli.bench --only qmm --json $OUT/qmm.json > $OUT/qmm.log 2>&1
echo "qmm rc=$? $(date -u +%FT%TZ)" >> $OUT/qmm.log
wait
left=$((${DEADLINE:-440} - SECONDS)); echo "e2e limit $left s" >> $OUT/qmm.log
timeout $left $py -m bi_rl.cli.bench --only e2e -v --repeats 2 --model-dir /tmp/qwen3-1.7b-e2e \
  --batches ${BATCHES:-64} --models ${MODELS:-bf16,4-bit} --json $OUT/e2e17.json > $OUT/e2e17.log 2>&1
echo "e2e rc=$? $(date -u +%FT%TZ)" >> $OUT/e2e17.log
