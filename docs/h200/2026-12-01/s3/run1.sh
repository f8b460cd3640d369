# Session 3, run 1: bits on the H200 (parallel lanes; timings in run 2, alone on the GPU).
set -o pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 BI_RL_CUDA_CACHE=/tmp/nvrtc-cache MLX_PTX_CACHE_DIR=/tmp/mlx-ptx
rm -rf /tmp/nvrtc-cache; cp -r .devrun/nvrtc-cache /tmp/nvrtc-cache; touch /tmp/start-marker
[ -f .devrun/mlx-ptx.tgz ] && tar xzf .devrun/mlx-ptx.tgz -C /tmp
python3 -m pip install -q --no-index --no-deps .devrun/wheels/*.whl 2>&1 | tail -1
R=$OUT/r1; mkdir -p $R
date -u +%FT%TZ | tee $R/date.txt
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader | tee -a $R/date.txt
git rev-parse HEAD >> $R/date.txt 2>/dev/null; python3 -c "from bi_rl._source import source_digest; print('source', source_digest())" | tee -a $R/date.txt
lane() { local name=$1 t=$2; shift 2; ( s=$SECONDS; timeout $t "$@" > $R/$name.log 2>&1; echo "== $name rc=$? [$((SECONDS-s)) s]" | tee -a $R/lanes.txt ) & }
lane verify-full 540 python3 -m bi_rl.cli.verify --jobs 6 --json $R/verify-full.json
lane tests 480 python3 -m pytest -q -n 4 -p xdist tests/test_cuda_*.py tests/test_train_grpo.py
lane famA 530 env T_MODEL=170 MODELS_DIR=/tmp/fam bash tools/families_run.sh $R/famA mixtral-q4 gpt_oss-q4 gemma2-q4
lane famB 530 env T_MODEL=170 MODELS_DIR=/tmp/famB bash tools/families_run.sh $R/famB gemma3_text-q4 gemma3_text-hd128-bf16 gemma3_text-hd128-q4
lane ctx32k 520 bash -c 'python3 -c "from pathlib import Path; from bi_rl.bench.e2e import WORKLOADS, write_models; write_models(WORKLOADS[\"qwen3-1.7b\"], Path(\"/tmp/q17\"))" && python3 -m bi_rl.cli.verify --model /tmp/q17/bf16 --context 32768 --prompts 4 --new-tokens 32 --json '$R'/ctx32k.json'
wait
nvidia-smi --query-gpu=memory.used --format=csv,noheader
tar czf $OUT/r1.tgz -C $OUT r1
tar czf $OUT/mlx-ptx.tgz -C /tmp mlx-ptx 2>/dev/null
find /tmp/nvrtc-cache -newer /tmp/start-marker -type f | tar czf $OUT/nvrtc-new.tgz -C / -T - 2>/dev/null
ls -la $OUT
cat $R/lanes.txt
