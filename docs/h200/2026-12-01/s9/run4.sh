set -o pipefail
export PYTHONUNBUFFERED=1 BI_RL_CUDA_CACHE=/tmp/nvrtc-cache MLX_PTX_CACHE_DIR=/tmp/mlx-ptx
bash .devrun/caches.sh
B=$PWD/.devrun/branch-np; D=$PWD/.devrun
date -u +%FT%TZ | tee $OUT/date.txt
s=$SECONDS; (cd $B && PYTHONPATH=$B timeout 400 python3 $D/attn_spb2.py > $OUT/attn-spb2.txt 2>&1); echo "== attn spb2 rc=$? [$((SECONDS-s)) s]" | tee -a $OUT/date.txt
cat $OUT/attn-spb2.txt
