# Session 3, run 2: kernel timings alone on the GPU (midtune), long-context rescoring split.
set -o pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 BI_RL_CUDA_CACHE=/tmp/nvrtc-cache MLX_PTX_CACHE_DIR=/tmp/mlx-ptx
[ -d /tmp/nvrtc-cache ] || cp -r .devrun/nvrtc-cache /tmp/nvrtc-cache
R=$OUT/r2; mkdir -p $R; date -u +%FT%TZ | tee $R/date.txt
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,memory.used --format=csv,noheader | tee -a $R/date.txt
step() { local name=$1 t=$2; shift 2; local s=$SECONDS; timeout $t "$@" > $R/$name.log 2>&1; echo "== $name rc=$? [$((SECONDS-s)) s]"; tail -${TAILN:-4} $R/$name.log; }
TAILN=45 step midtune 280 python3 tools/hopper_check.py midtune --json $R/midtune.json
TAILN=8 step rescore-long 260 python3 -m bi_rl.cli.bench --only rescore-long --model-dir /tmp/q17 --repeats 3 --json $R/rescore-long.json -v
tar czf $OUT/r2.tgz -C $OUT r2
