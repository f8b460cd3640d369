# Next session, call 4: the 1.7B end to end at batch 128 (decode is host-bound at 64: a
# larger batch costs the host the same per step).
set -o pipefail
export PYTHONUNBUFFERED=1 BI_RL_CUDA_CACHE=/tmp/nvrtc-cache MLX_PTX_CACHE_DIR=/tmp/mlx-ptx PYTHONPATH=$PWD
R=$OUT/n2; mkdir -p $R; date -u +%FT%TZ | tee $R/date.txt
s=$SECONDS; timeout 380 python3 -m bi_rl.cli.bench --only e2e --model-dir /tmp/q17 --batches 128 --repeats 2 --json $R/e2e-b128.json -v > $R/e2e.log 2>&1; echo "== e2e rc=$? [$((SECONDS-s)) s]"; tail -8 $R/e2e.log
tar czf $OUT/n2.tgz -C $OUT n2
