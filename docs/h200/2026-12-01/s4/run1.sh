# Session 4, call 3: full bi-verify from prebuilt MLX kernels (main), beside it the
# attn-split-smem branch's CUDA attention tests, and the 1.7B-shaped models for later calls.
set -o pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 BI_RL_CUDA_CACHE=/tmp/nvrtc-cache MLX_PTX_CACHE_DIR=/tmp/mlx-ptx
[ -d /tmp/nvrtc-cache ] || cp -r .devrun/nvrtc-cache /tmp/nvrtc-cache
mkdir -p /tmp/mlx-ptx && tar xzf .devrun/mlx-cache-verify.tgz -C /tmp && cp -n /tmp/mlx-cache-verify/* /tmp/mlx-ptx/
python3 -m pip install -q --no-index --no-deps .devrun/wheels/*.whl 2>&1 | tail -1
R=$OUT/s1; mkdir -p $R
date -u +%FT%TZ | tee $R/date.txt
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader | tee -a $R/date.txt
python3 -c "from bi_rl._source import source_digest; print('source', source_digest())" | tee -a $R/date.txt
git log -1 --format=%h | tee -a $R/date.txt
lane() { local name=$1 t=$2; shift 2; ( s=$SECONDS; timeout $t "$@" > $R/$name.log 2>&1; echo "== $name rc=$? [$((SECONDS-s)) s]" | tee -a $R/lanes.txt ) & }
[ -f /tmp/verify.jsonl ] && RES=--resume
lane verify-full 545 python3 -m bi_rl.cli.verify --log /tmp/verify.jsonl $RES --json $R/verify-full.json
lane split-tests 540 bash -c 'cd .devrun/branch && PYTHONPATH=$PWD python3 -m pytest -q -n 8 -p xdist tests/test_cuda_attention.py tests/test_cuda_attention_build.py'
lane q17 300 python3 -c "from pathlib import Path; from bi_rl.bench.e2e import WORKLOADS, write_models; write_models(WORKLOADS['qwen3-1.7b'], Path('/tmp/q17'))"
wait
cat $R/lanes.txt
cp /tmp/verify.jsonl $R/
tail -6 $R/split-tests.log; tail -25 $R/verify-full.log
tar czf $OUT/s1.tgz -C $OUT s1
