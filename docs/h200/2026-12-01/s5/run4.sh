# Session 5, call 3 (after restaging): the full bi-verify's remaining stock-control checks
# resumed from the log of call 1 (branch tree = main be7d028, same source digest), spread
# over 12 worker processes; then the engine's host phases at B = 64 (tools/engine_profile.py
# --phases-only), alone on the GPU.
set -o pipefail
export PYTHONUNBUFFERED=1 BI_RL_CUDA_CACHE=/tmp/nvrtc-cache MLX_PTX_CACHE_DIR=/tmp/mlx-ptx
[ -d /tmp/nvrtc-cache ] || cp -r .devrun/nvrtc-cache /tmp/nvrtc-cache
R=$OUT/n4; mkdir -p $R; date -u +%FT%TZ | tee $R/date.txt
cp .devrun/verify.jsonl /tmp/verify.jsonl
(PYTHONPATH=$PWD python3 -c "from pathlib import Path; from bi_rl.bench.e2e import WORKLOADS, write_models; write_models(WORKLOADS['qwen3-1.7b'], Path('/tmp/q17'))" > $R/q17.log 2>&1) &
s=$SECONDS; (cd .devrun/branch && PYTHONPATH=$PWD timeout 420 python3 -m bi_rl.cli.verify --log /tmp/verify.jsonl --resume --jobs 12 --json $R/verify-full.json > $R/verify-full.log 2>&1); echo "== verify rc=$? [$((SECONDS-s)) s]" | tee -a $R/date.txt
wait
cp /tmp/verify.jsonl $R/
s=$SECONDS; PYTHONPATH=$PWD timeout 140 python3 .devrun/engine_profile.py --model-dir /tmp/q17 --batch 64 --steps 96 --phases-only --json $R/phases-b64.json > $R/phases-b64.log 2>&1; echo "== phases rc=$? [$((SECONDS-s)) s]" | tee -a $R/date.txt
tail -15 $R/verify-full.log; tail -12 $R/phases-b64.log
tar czf $OUT/n4.tgz -C $OUT n4
