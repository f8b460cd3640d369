set -o pipefail
export PYTHONUNBUFFERED=1 BI_RL_CUDA_CACHE=/tmp/nvrtc-cache MLX_PTX_CACHE_DIR=/tmp/mlx-ptx PYTHONPATH=$PWD
bash .devrun/caches.sh
R=$OUT/p6; mkdir -p $R; date -u +%FT%TZ | tee $R/date.txt
s=$SECONDS; timeout 60 python3 .devrun/attn_cell.py > $R/attn-cell.txt 2>&1; echo "== cell rc=$? [$((SECONDS-s)) s]" | tee -a $R/date.txt; cat $R/attn-cell.txt
s=$SECONDS; timeout 170 python3 -m pytest -q -n 8 -p xdist tests/test_cuda_attention.py tests/test_cuda_attention_build.py > $R/tests.log 2>&1; echo "== attention tests rc=$? [$((SECONDS-s)) s]" | tee -a $R/date.txt; tail -2 $R/tests.log
