#!/usr/bin/env bash
# Every GPU test file at the 512-key default, the golden logs the previous call re-made on
# this machine (/tmp/golden) in place. Carry [".stage2"]; same warm machine as call-golden.sh.
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
python3 -P -c "import mlx.core" 2>/dev/null || { bash .stage2/install > /tmp/install2.log 2>&1; echo "install rc=$?"; }
o=$OUT/t; mkdir -p $o
cp /tmp/golden/h200-*.jsonl rollouts/ && sha256sum rollouts/h200-*.jsonl | tee $o/golden.sha
JOBS=8 T_GPU=${T_GPU:-540} bash tools/cuda_device_run.sh $o gpu
gzip -f $o/gpu.log
tar czf $OUT/t.tgz -C $OUT t && rm -rf $o
