export BI_RL_CUDA_CACHE=/tmp/nvrtc-cache MLX_PTX_CACHE_DIR=/tmp/mlx-ptx PYTHONPATH=$PWD
mkdir -p $OUT
[ -d /tmp/nvrtc-cache ] || cp -r .devrun/nvrtc-cache /tmp/nvrtc-cache
[ -d /tmp/q17 ] || python3 -c "from pathlib import Path; from bi_rl.bench.e2e import WORKLOADS, write_models; write_models(WORKLOADS['qwen3-1.7b'], Path('/tmp/q17'))"
for cfg in "" "MLX_USE_CUDA_GRAPHS=0" "MLX_CUDA_GRAPH_CACHE_SIZE=4096" "MLX_MAX_OPS_PER_BUFFER=1000 MLX_MAX_MB_PER_BUFFER=4000" "MLX_MAX_OPS_PER_BUFFER=50" "MLX_CUDA_USE_CUDNN_SDPA=0"; do
  echo "== ${cfg:-defaults}"; env $cfg timeout 60 python3 .devrun/sync_parts.py 64 2>&1 | grep -v compil
done 2>&1 | tee $OUT/knobs.txt
