# main's full bi-verify again (f2's timed out at 240 s while MLX compiled its attention kernels
# on first use; they are in /tmp/mlx-new now), then the fused-proj bare-step A/B twice more.
set -o pipefail
export PYTHONUNBUFFERED=1 MLX_PTX_CACHE_DIR=/tmp/mlx-new
D=$PWD/.devrun; bash $D/caches.sh main
R=$OUT/f3; mkdir -p $R; date -u +%FT%TZ | tee $R/date.txt
s=$SECONDS; BI_RL_CUDA_CACHE=/tmp/nvrtc-new PYTHONPATH=$PWD timeout 420 python3 -m bi_rl.cli.verify --jobs 12 --json $R/verify.json > $R/verify.log 2>&1; echo "== verify rc=$? [$((SECONDS-s)) s]" | tee -a $R/date.txt; tail -3 $R/verify.log
for i in 1 2; do s=$SECONDS; (cd $D/branch-fp && BI_RL_CUDA_CACHE=/tmp/nvrtc-fp PYTHONPATH=$D/branch-fp timeout 100 python3 $D/ab_group.py /tmp/q17 > $R/ab-group-$i.txt 2>&1); echo "== ab $i rc=$? [$((SECONDS-s)) s]" | tee -a $R/date.txt; tail -4 $R/ab-group-$i.txt; done
gzip -f $R/*.log; tar czf $OUT/f3.tgz -C $OUT f3
