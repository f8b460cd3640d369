# Session 3, run 4 (fresh machine): bits in parallel lanes, then timings alone on the GPU.
set -o pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 BI_RL_CUDA_CACHE=/tmp/nvrtc-cache MLX_PTX_CACHE_DIR=/tmp/mlx-ptx
rm -rf /tmp/nvrtc-cache; cp -r .devrun/nvrtc-cache /tmp/nvrtc-cache; tar xzf .devrun/mlx-ptx.tgz -C /tmp
python3 -m pip install -q --no-index --no-deps .devrun/wheels/*.whl 2>&1 | tail -1
R=$OUT/r4; mkdir -p $R
date -u +%FT%TZ | tee $R/date.txt
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader | tee -a $R/date.txt
python3 -c "from bi_rl._source import source_digest; print('source', source_digest())" | tee -a $R/date.txt
lane() { local name=$1 t=$2; shift 2; ( s=$SECONDS; timeout $t "$@" > $R/$name.log 2>&1; echo "== $name rc=$? [$((SECONDS-s)) s]" | tee -a $R/lanes.txt ) & }
lane verify-mode 230 python3 -m bi_rl.cli.verify --no-control --json $R/verify-mode.json
lane verify-gemm 120 python3 -m bi_rl.cli.verify --only gemm --json $R/verify-gemm.json
lane tests 200 python3 -m pytest -q -n 2 -p xdist tests/test_cuda_hopper.py tests/test_cuda_qmm.py tests/test_cuda_gemm.py
lane mixtral 200 env T_MODEL=190 MODELS_DIR=/tmp/fam bash tools/families_run.sh $R/fam mixtral-q4
lane q17 200 bash -c 'python3 -c "from pathlib import Path; from bi_rl.bench.e2e import WORKLOADS, write_models; write_models(WORKLOADS[\"qwen3-1.7b\"], Path(\"/tmp/q17\"))" && for m in bf16 q4; do python3 -m bi_rl.cli.verify --model /tmp/q17/$m --json '$R'/verify-17b-$m.json; done'
wait
cat $R/lanes.txt
tail -4 $R/verify-mode.log $R/verify-gemm.log $R/tests.log
grep -hE "^(PASS|FAIL|Control)|mode strict|stock MLX \(control\)" $R/q17.log $R/fam/mixtral-q4.log 2>/dev/null
s=$SECONDS; timeout 110 python3 -m bi_rl.cli.bench --only e2e --model-dir /tmp/q17 --batches 1 --repeats 3 --json $R/e2e-b1.json -v > $R/e2e-b1.log 2>&1; echo "== e2e rc=$? [$((SECONDS-s)) s]"; tail -6 $R/e2e-b1.log
s=$SECONDS; timeout 45 python3 -m bi_rl.cli.bench --only rescore-long --model-dir /tmp/q17 --repeats 3 --json $R/rescore-long.json -v > $R/rescore-long.log 2>&1; echo "== rescore-long rc=$? [$((SECONDS-s)) s]"; tail -4 $R/rescore-long.log
tar czf $OUT/r4.tgz -C $OUT r4
