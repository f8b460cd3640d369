# The fused-proj branch's bare-step A/B (f1.sh's path to ab_group.py was taken after cd), then
# main's full bi-verify in the same call.
set -o pipefail
export PYTHONUNBUFFERED=1 BI_RL_CUDA_CACHE=/tmp/nvrtc-fp MLX_PTX_CACHE_DIR=/tmp/mlx-new
D=$PWD/.devrun; bash $D/caches.sh fp; bash $D/caches.sh main
R=$OUT/f2; mkdir -p $R; date -u +%FT%TZ | tee $R/date.txt
[ -f /tmp/q17/bf16/config.json ] || python3 -c "from pathlib import Path; from bi_rl.bench.e2e import WORKLOADS, write_models; write_models(WORKLOADS['qwen3-1.7b'], Path('/tmp/q17'))" > /dev/null 2>&1
s=$SECONDS; (cd $D/branch-fp && PYTHONPATH=$D/branch-fp timeout 200 python3 $D/ab_group.py /tmp/q17 > $R/ab-group.txt 2>&1); echo "== ab rc=$? [$((SECONDS-s)) s]" | tee -a $R/date.txt; cat $R/ab-group.txt | tail -12
s=$SECONDS; BI_RL_CUDA_CACHE=/tmp/nvrtc-new PYTHONPATH=$PWD timeout 240 python3 -m bi_rl.cli.verify --jobs 12 --json $R/verify.json > $R/verify.log 2>&1; echo "== verify rc=$? [$((SECONDS-s)) s]" | tee -a $R/date.txt; tail -3 $R/verify.log
gzip -f $R/*.log; tar czf $OUT/f2.tgz -C $OUT f2
