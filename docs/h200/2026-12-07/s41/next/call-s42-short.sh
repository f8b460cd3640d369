#!/usr/bin/env bash
# call-s42.sh cut for a session whose device time runs short (never ran): its steps 1-4,
# fewest cells first. The engine and cache tests on the GPU (the new mode-off test compares
# masked and unmasked stock attention on CUDA); one 431-token sequence's strict rescoring
# (its bench run writes the 1.7B-shaped models); mode off's bare decode step with the mask
# dropped and kept (mask_ab.py, from docs/cpu/2026-12-07/s41/), B = 1; end to end in bf16 at
# B = 1, 3 repeats. Copy this and mask_ab.py to the repository root; carry [".stage2"].
python3 -P -c "import mlx.core" 2>/dev/null || { bash .stage2/install > /tmp/install.log 2>&1; echo "install rc=$? [$SECONDS s]"; }
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
T=${T_ALL:-400}
o=$OUT/n; mkdir -p $o
date -u +%FT%TZ | tee $o/date.txt
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $o/device.txt
git log --oneline -1 > $o/commit.txt 2>/dev/null
timeout ${T_TESTS:-100} python3 -P -m pytest -q -p no:cacheprovider tests/test_engine.py \
  tests/test_caches.py > $o/tests.log 2>&1
echo "tests rc=$? [$SECONDS s]"; grep -E "FAILED|passed|failed" $o/tests.log | tail -8
M=/tmp/qwen3-1.7b-e2e
timeout 100 python3 -P -m bi_rl.cli.bench --only rescore-long -v --repeats 5 --model-dir $M \
  --models bf16 --long-batch 1 --long-length 431 --json $o/rescore-1x431.json \
  > $o/rescore-1x431.log 2>&1
echo "rescore 1x431 rc=$? [$SECONDS s]"; tail -1 $o/rescore-1x431.log
left=$(( T - SECONDS )); [ $left -gt 30 ] && timeout $(( left < 70 ? left : 70 )) \
  python3 -P mask_ab.py $M/bf16 1 64 > $o/mask-ab.txt 2>&1
echo "mask ab b1 rc=$? [$SECONDS s]"; grep dropped $o/mask-ab.txt
left=$(( T - SECONDS ))
[ $left -gt 45 ] && timeout $left python3 -P -m bi_rl.cli.bench --only e2e -v --repeats 3 \
  --model-dir $M --batches 1 --models bf16 --json $o/e2e.json > $o/e2e.log 2>&1
echo "e2e bf16 rc=$? [$SECONDS s]"; grep " B=" $o/e2e.log | tail -2
tar czf $OUT/n.tgz -C $OUT n && rm -rf $o
