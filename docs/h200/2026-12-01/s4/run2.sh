set -o pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 BI_RL_CUDA_CACHE=/tmp/nvrtc-cache MLX_PTX_CACHE_DIR=/tmp/mlx-ptx
R=$OUT/s2; mkdir -p $R; date -u +%FT%TZ | tee $R/date.txt
s=$SECONDS; timeout 280 python3 -m bi_rl.cli.verify --log /tmp/verify.jsonl --resume --json $R/verify-full.json > $R/verify-full.log 2>&1; echo "== verify rc=$? [$((SECONDS-s)) s]"; tail -15 $R/verify-full.log
cp /tmp/verify.jsonl $R/
s=$SECONDS; timeout 140 python3 -m bi_rl.cli.bench --only attention --json $R/attn-main.json > $R/attn-main.log 2>&1; echo "== attn main rc=$? [$((SECONDS-s)) s]"
s=$SECONDS; (cd .devrun/branch && PYTHONPATH=$PWD timeout 140 python3 -m bi_rl.cli.bench --only attention --json $R/attn-split.json > $R/attn-split.log 2>&1); echo "== attn split rc=$? [$((SECONDS-s)) s]"
tail -30 $R/attn-main.log $R/attn-split.log
tar czf $OUT/s2.tgz -C $OUT s2
