# Next session, call 3 (after staging): the full bi-verify on main (control walking batches
# from the largest down), 12 workers, from the prebuilt MLX kernels (kernels/cuda unchanged
# since be7d028, so mlx-cache-branch.tgz still matches); the 1.7B model written alongside.
set -o pipefail
export PYTHONUNBUFFERED=1 BI_RL_CUDA_CACHE=/tmp/nvrtc-cache MLX_PTX_CACHE_DIR=/tmp/mlx-ptx
[ -d /tmp/nvrtc-cache ] || cp -r .devrun/nvrtc-cache /tmp/nvrtc-cache
mkdir -p /tmp/mlx-ptx && tar xzf .devrun/mlx-cache-branch.tgz -C /tmp && cp -n /tmp/mlx-cache-branch/* /tmp/mlx-ptx/
python3 -m pip install -q --no-index --no-deps .devrun/wheels/*.whl 2>&1 | tail -1
R=$OUT/n1; mkdir -p $R; date -u +%FT%TZ | tee $R/date.txt
PYTHONPATH=$PWD python3 -c "from bi_rl._source import source_digest; print('source', source_digest())" | tee -a $R/date.txt
(PYTHONPATH=$PWD python3 -c "from pathlib import Path; from bi_rl.bench.e2e import WORKLOADS, write_models; write_models(WORKLOADS['qwen3-1.7b'], Path('/tmp/q17'))" > $R/q17.log 2>&1) &
[ -f /tmp/verify.jsonl ] && RES=--resume
s=$SECONDS; PYTHONPATH=$PWD timeout 480 python3 -m bi_rl.cli.verify --jobs 12 --log /tmp/verify.jsonl $RES --json $R/verify-full.json > $R/verify-full.log 2>&1; echo "== verify rc=$? [$((SECONDS-s)) s]" | tee -a $R/date.txt
wait; cp /tmp/verify.jsonl $R/
grep -E "PASS|FAIL|Control" $R/verify-full.log
tar czf $OUT/n1.tgz -C $OUT n1
