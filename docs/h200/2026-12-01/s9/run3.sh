# Next session, call 5: end to end at B = 1 and 8 (the batches whose decode GEMMs run on the
# few-row kernel) with narrow-pipe, beside stock MLX and mlx-lm, 3 repeats.
set -o pipefail
export PYTHONUNBUFFERED=1 BI_RL_CUDA_CACHE=/tmp/nvrtc-cache MLX_PTX_CACHE_DIR=/tmp/mlx-ptx
bash .devrun/caches.sh
R=$OUT/p3; mkdir -p $R; date -u +%FT%TZ | tee $R/date.txt
B=$PWD/.devrun/branch-np
[ -f /tmp/q17/bf16/config.json ] || (cd $B && PYTHONPATH=$B python3 -c "from pathlib import Path; from bi_rl.bench.e2e import WORKLOADS, write_models; write_models(WORKLOADS['qwen3-1.7b'], Path('/tmp/q17'))")
s=$SECONDS; (cd $B && PYTHONPATH=$B timeout 280 python3 -m bi_rl.cli.bench --only e2e --model-dir /tmp/q17 --batches 8 --repeats 3 -v --json $R/e2e-b8.json > $R/e2e-b8.log 2>&1); echo "== e2e B=8 rc=$? [$((SECONDS-s)) s]" | tee -a $R/date.txt; grep -vE "compil|\[[0-9]+/" $R/e2e-b8.log | tail -5
s=$SECONDS; (cd $B && PYTHONPATH=$B timeout 280 python3 -m bi_rl.cli.bench --only e2e --model-dir /tmp/q17 --batches 1 --repeats 3 -v --json $R/e2e-b1.json > $R/e2e-b1.log 2>&1); echo "== e2e B=1 rc=$? [$((SECONDS-s)) s]" | tee -a $R/date.txt; grep -vE "compil|\[[0-9]+/" $R/e2e-b1.log | tail -5
gzip -f $R/*.log; tar czf $OUT/p3.tgz -C $OUT p3
