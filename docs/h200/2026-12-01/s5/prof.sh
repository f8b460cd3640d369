export BI_RL_CUDA_CACHE=/tmp/nvrtc-cache MLX_PTX_CACHE_DIR=/tmp/mlx-ptx PYTHONPATH=$PWD PYTHONUNBUFFERED=1
mkdir -p $OUT
[ -d /tmp/nvrtc-cache ] || cp -r .devrun/nvrtc-cache /tmp/nvrtc-cache
timeout 150 python3 .devrun/hostprof.py strict off 2>&1 | grep -v compil > $OUT/hostprof.txt; echo rc=$?
head -c 2500 $OUT/hostprof.txt
