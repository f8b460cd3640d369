set -o pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 BI_RL_CUDA_CACHE=/tmp/nvrtc-cache MLX_PTX_CACHE_DIR=/tmp/mlx-ptx
R=$OUT/s3; mkdir -p $R; date -u +%FT%TZ | tee $R/date.txt
ls /tmp/q17 || python3 -c "from pathlib import Path; from bi_rl.bench.e2e import WORKLOADS, write_models; write_models(WORKLOADS['qwen3-1.7b'], Path('/tmp/q17'))"
s=$SECONDS; timeout 520 python3 -m bi_rl.cli.bench --only e2e --model-dir /tmp/q17 --batches 8 64 --repeats 3 --json $R/e2e-b8-64.json -v > $R/e2e.log 2>&1; echo "== e2e rc=$? [$((SECONDS-s)) s]"; tail -30 $R/e2e.log
tar czf $OUT/s3.tgz -C $OUT s3
