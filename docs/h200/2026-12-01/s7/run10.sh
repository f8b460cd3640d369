# Session 7, last call: the attention bench on main (lean kernel, attention default on, one
# warpgroup at head dim 64).
export PYTHONUNBUFFERED=1 BI_RL_CUDA_CACHE=/tmp/nvrtc-cache MLX_PTX_CACHE_DIR=/tmp/mlx-ptx
mkdir -p /tmp/mlx-ptx && tar xzf .devrun/mlx-cache-s8.tgz -C /tmp && cp -rn /tmp/mlx-cache-s8/. /tmp/mlx-ptx/
cp -r .devrun/nvrtc-cache /tmp/nvrtc-cache
R=$OUT/s9; mkdir -p $R; date -u +%FT%TZ | tee $R/date.txt
B=$PWD/.devrun/branch-main
s=$SECONDS; (cd $B && PYTHONPATH=$B timeout 110 python3 -m bi_rl.cli.bench --only attention --json $R/attn.json > $R/attn.log 2>&1); echo "== bench rc=$? [$((SECONDS-s)) s]" | tee -a $R/date.txt; grep -E "prefill" $R/attn.log
