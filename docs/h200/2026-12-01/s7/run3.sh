# Next session, call 5: end to end on the 1.7B shape with the branch (rescoring with the wgmma
# prefill attention), and long rescoring, 3 repeats.
set -o pipefail
export PYTHONUNBUFFERED=1 BI_RL_CUDA_CACHE=/tmp/nvrtc-cache MLX_PTX_CACHE_DIR=/tmp/mlx-ptx
[ -d /tmp/mlx-ptx ] || { mkdir -p /tmp/mlx-ptx && tar xzf .devrun/mlx-cache-s7.tgz -C /tmp && cp -rn /tmp/mlx-cache-s7/. /tmp/mlx-ptx/; }
[ -d /tmp/nvrtc-cache ] || cp -r .devrun/nvrtc-cache /tmp/nvrtc-cache
python3 -m pip install -q --no-index --no-deps .devrun/wheels/*.whl 2>&1 | tail -1
R=$OUT/s7c; mkdir -p $R; date -u +%FT%TZ | tee $R/date.txt
B=$PWD/.devrun/branch-def
s=$SECONDS; (cd $B && PYTHONPATH=$B timeout 120 python3 -m bi_rl.cli.bench --only rescore-long --model-dir /tmp/q17 --repeats 3 --json $R/rescore-long.json > $R/rescore-long.log 2>&1); echo "== rescore-long rc=$? [$((SECONDS-s)) s]"; tail -4 $R/rescore-long.log
s=$SECONDS; (cd $B && PYTHONPATH=$B timeout 420 python3 -m bi_rl.cli.bench --only e2e --model-dir /tmp/q17 --batches 64 --repeats 3 -v --json $R/e2e-b64.json > $R/e2e.log 2>&1); echo "== e2e rc=$? [$((SECONDS-s)) s]"; grep -vE "compil|\[[0-9]+/" $R/e2e.log | tail -20
tar czf $OUT/s7c.tgz -C $OUT s7c
