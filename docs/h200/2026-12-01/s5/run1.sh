# Next session, call 3 (after staging): the attn-decode branch (several splits per block, the
# fast K/V tile copy; .devrun/branch) under its CUDA tests, and the full bi-verify on the
# branch's code from its prebuilt MLX kernels (.devrun/mlx-cache-branch.tgz), resumable.
# If the branch's tests fail: run the full sweep on main instead (mlx-cache-verify.tgz).
set -o pipefail
export PYTHONUNBUFFERED=1 BI_RL_CUDA_CACHE=/tmp/nvrtc-cache MLX_PTX_CACHE_DIR=/tmp/mlx-ptx
[ -d /tmp/nvrtc-cache ] || cp -r .devrun/nvrtc-cache /tmp/nvrtc-cache
mkdir -p /tmp/mlx-ptx && tar xzf .devrun/mlx-cache-branch.tgz -C /tmp && cp -n /tmp/mlx-cache-branch/* /tmp/mlx-ptx/
python3 -m pip install -q --no-index --no-deps .devrun/wheels/*.whl 2>&1 | tail -1
R=$OUT/n1; mkdir -p $R; date -u +%FT%TZ | tee $R/date.txt
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader | tee -a $R/date.txt
(cd .devrun/branch && PYTHONPATH=$PWD python3 -c "from bi_rl._source import source_digest; print('branch source', source_digest())") | tee -a $R/date.txt
lane() { local name=$1 t=$2; shift 2; ( s=$SECONDS; timeout $t "$@" > $R/$name.log 2>&1; echo "== $name rc=$? [$((SECONDS-s)) s]" | tee -a $R/lanes.txt ) & }
[ -f /tmp/verify.jsonl ] && RES=--resume
lane tests 520 bash -c 'cd .devrun/branch && PYTHONPATH=$PWD python3 -m pytest -q -n 8 -p xdist tests/test_cuda_*.py tests/test_attention_window.py tests/test_train_grpo.py'
lane verify-full 540 bash -c "cd .devrun/branch && PYTHONPATH=\$PWD python3 -m bi_rl.cli.verify --log /tmp/verify.jsonl $RES --json $R/verify-full.json"
lane q17 300 env PYTHONPATH=$PWD python3 -c "from pathlib import Path; from bi_rl.bench.e2e import WORKLOADS, write_models; write_models(WORKLOADS['qwen3-1.7b'], Path('/tmp/q17'))"
wait
cat $R/lanes.txt; cp /tmp/verify.jsonl $R/
tail -5 $R/tests.log; tail -8 $R/verify-full.log
tar czf $OUT/n1.tgz -C $OUT n1
