# Main on a fresh machine: every GPU test file and the full bi-verify sweep side by side
# (tools/cuda_device_run.sh checks), while the 1.7B-shaped models for the end-to-end run are
# written to /tmp/q17 in the background.
export PYTHONUNBUFFERED=1 BI_RL_CUDA_CACHE=/tmp/nvrtc
R=$OUT/c1; mkdir -p $R /tmp/nvrtc; git log -1 --format=%h > $R/tree.txt 2>/dev/null
(PYTHONPATH=$PWD python3 -c "from pathlib import Path; from bi_rl.bench.e2e import WORKLOADS, write_models; write_models(WORKLOADS['qwen3-1.7b'], Path('/tmp/q17'))" > $R/q17.log 2>&1; echo done >> $R/q17.log) &
JOBS=6 VERIFY_JOBS=10 T_GPU=450 T_SWEEP=450 bash tools/cuda_device_run.sh $R checks
wait; tail -1 $R/q17.log
