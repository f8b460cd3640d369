#!/usr/bin/env bash
# The fused keyed draw (kernels/cuda/sample.cu): its GPU tests, the H200 golden logs and the
# engine's GPU tests with it in place; then tools/engine_profile.py on the 1.7B shape, bf16
# batch 64 with the draw fused and with BI_RL_FUSED_DRAW=0, and 4-bit batch 8 (the engine's
# 1.49x step of the thirty-fourth session). Carry [".stage2"]; run from the repository root.
bash .stage2/install > /tmp/install.log 2>&1; echo "install rc=$? [$SECONDS s]"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
py="python3 -P"
o=$OUT/f; mkdir -p $o
date -u +%FT%TZ | tee $o/date.txt
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $o/device.txt
git log -1 --format=%H > $o/commit.txt 2>/dev/null
xd=""; $py -c "import xdist" 2>/dev/null && xd="-p xdist -n 8"
timeout 200 $py -m pytest -q -p no:cacheprovider $xd tests/test_cuda_sample.py \
  tests/test_rollouts_golden.py tests/test_engine.py tests/test_generate.py > $o/tests.log 2>&1
echo "tests rc=$? [$SECONDS s]"; grep -E "passed|failed|FAILED|Error" $o/tests.log | tail -12
md=/tmp/qwen3-1.7b-e2e
for arm in fused plain; do
  [ $arm = plain ] && export BI_RL_FUSED_DRAW=0
  timeout 150 $py tools/engine_profile.py --model bf16 --batch 64 --steps 96 --repeats 3 \
    --model-dir $md --json $o/engine-bf16-b64-$arm.json > $o/engine-bf16-b64-$arm.log 2>&1
  echo "profile bf16 b64 $arm rc=$? [$SECONDS s]"; grep -v compiling $o/engine-bf16-b64-$arm.log | tail -22
done
unset BI_RL_FUSED_DRAW
timeout $((585 - SECONDS)) $py tools/engine_profile.py --model q4 --batch 8 --steps 96 \
  --repeats 3 --model-dir $md --json $o/engine-q4-b8.json > $o/engine-q4-b8.log 2>&1
echo "profile q4 b8 rc=$? [$SECONDS s]"; grep -v compiling $o/engine-q4-b8.log | tail -22
tar czf $OUT/f.tgz -C $OUT f && rm -rf $o
