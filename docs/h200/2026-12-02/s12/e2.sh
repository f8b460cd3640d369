# Run as one command line (after e1.sh on the same warm machine): end to end on the 1.7B
# shape at batch 1 and 8, three repeats, with mlx-lm's batch_generate as the peer column.
export PYTHONUNBUFFERED=1 BI_RL_CUDA_CACHE=/tmp/nvrtc-new MLX_PTX_CACHE_DIR=/tmp/mlx-new PYTHONPATH=$PWD; R=$OUT/e2; mkdir -p $R; date -u +%FT%TZ | tee $R/date.txt; s=$SECONDS; timeout 560 python3 -m bi_rl.cli.bench --only e2e --model-dir /tmp/q17 --batches 1,8 --repeats 3 --json $R/e2e-1-8.json -v 2>&1 | tee $R/e2e-1-8.log; echo "rc=$? [$((SECONDS-s)) s]" | tee -a $R/date.txt
