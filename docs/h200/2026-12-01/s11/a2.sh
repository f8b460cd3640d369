# attn-order against main again, in the other order (main first, then the branch), so that a
# warming GPU cannot favour the branch: bi-bench --only attention, each in its own process.
set -o pipefail
export PYTHONUNBUFFERED=1 MLX_PTX_CACHE_DIR=/tmp/mlx-new
bash .devrun/caches.sh main; bash .devrun/caches.sh ao
R=$OUT/a2; mkdir -p $R; date -u +%FT%TZ | tee $R/date.txt
B=$PWD/.devrun/branch-ao
s=$SECONDS; BI_RL_CUDA_CACHE=/tmp/nvrtc-new PYTHONPATH=$PWD timeout 95 python3 -m bi_rl.cli.bench --only attention -v --json $R/attn-main.json > $R/attn-main.log 2>&1; echo "== main bench rc=$? [$((SECONDS-s)) s]" | tee -a $R/date.txt; grep -i prefill $R/attn-main.log | tail -8
s=$SECONDS; (cd $B && BI_RL_CUDA_CACHE=/tmp/nvrtc-ao PYTHONPATH=$B timeout 95 python3 -m bi_rl.cli.bench --only attention -v --json $R/attn-branch.json > $R/attn-branch.log 2>&1); echo "== branch bench rc=$? [$((SECONDS-s)) s]" | tee -a $R/date.txt; grep -i prefill $R/attn-branch.log | tail -8
