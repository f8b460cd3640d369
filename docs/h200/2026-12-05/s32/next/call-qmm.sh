#!/usr/bin/env bash
# bi-bench's quantized table with the wider 4-bit decode blocks (compiles every quantized
# instantiation on a fresh machine: give it 300 s), then the GPU tests in what is left.
bash .stage2/install > /tmp/install.log 2>&1; echo "install rc=$?"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
mkdir -p $OUT/q
timeout 300 python3 -P -m bi_rl.cli.bench --only qmm -v --json $OUT/q/qmm.json > $OUT/q/qmm.log 2>&1
echo "qmm rc=$?"; tail -30 $OUT/q/qmm.log
T_GPU=${T_GPU:-260} JOBS=8 bash tools/cuda_device_run.sh $OUT/q gpu
gzip -f $OUT/q/gpu.log
tar czf $OUT/q.tgz -C $OUT q && rm -rf $OUT/q
