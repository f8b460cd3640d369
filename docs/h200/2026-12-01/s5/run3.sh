# Next session, call 5 (if time is left): the 1.7B end to end at batch 64 on the branch's code.
set -o pipefail
export PYTHONUNBUFFERED=1 BI_RL_CUDA_CACHE=/tmp/nvrtc-cache MLX_PTX_CACHE_DIR=/tmp/mlx-ptx
R=$OUT/n3; mkdir -p $R; date -u +%FT%TZ | tee $R/date.txt
B=$PWD/.devrun/branch
s=$SECONDS; (cd $B && PYTHONPATH=$B timeout 500 python3 -m bi_rl.cli.bench --only e2e --model-dir /tmp/q17 --batches 64 --repeats 3 --json $R/e2e-b64.json -v > $R/e2e.log 2>&1); echo "== e2e rc=$? [$((SECONDS-s)) s]"; tail -12 $R/e2e.log
tar czf $OUT/n3.tgz -C $OUT n3
