# Next session, call 4: the full bi-verify with the branch (wgmma prefill attention on).
set -o pipefail
export PYTHONUNBUFFERED=1 BI_RL_CUDA_CACHE=/tmp/nvrtc-cache MLX_PTX_CACHE_DIR=/tmp/mlx-ptx
# MLX's own kernels of the sweep, prebuilt offline for these kernels/ (tools/cuda_offline.py
# cache --workloads verify-full, from the branch's code): MLX never writes custom kernels there
mkdir -p /tmp/mlx-ptx && tar xzf .devrun/mlx-cache-s7.tgz -C /tmp && cp -rn /tmp/mlx-cache-s7/. /tmp/mlx-ptx/
[ -d /tmp/nvrtc-cache ] || cp -r .devrun/nvrtc-cache /tmp/nvrtc-cache
python3 -m pip install -q --no-index --no-deps .devrun/wheels/*.whl 2>&1 | tail -1
R=$OUT/s7b; mkdir -p $R; date -u +%FT%TZ | tee $R/date.txt
B=$PWD/.devrun/branch-def
[ -f /tmp/verify.jsonl ] && RES=--resume
s=$SECONDS; (cd $B && PYTHONPATH=$B timeout 540 python3 -m bi_rl.cli.verify --jobs 12 --log /tmp/verify.jsonl $RES --json $R/verify-full.json > $R/verify-full.log 2>&1); echo "== verify rc=$? [$((SECONDS-s)) s]" | tee -a $R/date.txt
cp /tmp/verify.jsonl $R/; gzip -f $R/verify.jsonl $R/verify-full.json
grep -E "PASS|FAIL|Control" $R/verify-full.log
tar czf $OUT/s7b.tgz -C $OUT s7b
