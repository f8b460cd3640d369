# Main on a fresh H200 (nothing compiled): every GPU test file (tools/cuda_device_run.sh's
# "gpu" part: CUDA kernels, windows, H200 golden logs, GRPO, fusion, engine, mode, generate,
# scorer, trainer logprobs, bi-rescore's CLI) side by side with the full bi-verify sweep
# ("checks"); the 1.7B-shaped models written to /tmp/q17 in the background for later runs.
export PYTHONUNBUFFERED=1 BI_RL_CUDA_CACHE=/tmp/nvrtc MLX_PTX_CACHE_DIR=/tmp/mlx-main PYTHONPATH=$PWD
mkdir -p /tmp/nvrtc /tmp/mlx-main
R=$OUT/c1; mkdir -p $R; git log -1 --format=%h > $R/tree.txt 2>/dev/null
(python3 -c "from pathlib import Path; from bi_rl.bench.e2e import WORKLOADS, write_models; write_models(WORKLOADS['qwen3-1.7b'], Path('/tmp/q17'))" > $R/q17.log 2>&1 &)
JOBS=6 VERIFY_JOBS=10 T_GPU=${T:-470} T_SWEEP=${T:-470} SWEEP_LOG=/tmp/sweep.jsonl bash tools/cuda_device_run.sh $R checks 2>&1 | tee $R/run.txt
cp /tmp/sweep.jsonl $R/ 2>/dev/null; gzip -f $R/*.log $R/sweep.jsonl 2>/dev/null; ls /tmp/q17 >> $R/q17.log 2>&1
