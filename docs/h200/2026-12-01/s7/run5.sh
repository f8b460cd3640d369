# Next session (if time): the attn-wgmma-lean branch (.devrun/branch-lean): its Hopper
# attention tests against the mma.sync kernel, then times beside main's kernel (wgprof.py).
set -o pipefail
export PYTHONUNBUFFERED=1 BI_RL_CUDA_CACHE=/tmp/nvrtc-cache MLX_PTX_CACHE_DIR=/tmp/mlx-ptx
[ -d /tmp/mlx-ptx ] || { mkdir -p /tmp/mlx-ptx && tar xzf .devrun/mlx-cache-s7.tgz -C /tmp && cp -rn /tmp/mlx-cache-s7/. /tmp/mlx-ptx/; }
[ -d /tmp/nvrtc-cache ] || cp -r .devrun/nvrtc-cache /tmp/nvrtc-cache
python3 -m pip install -q --no-index --no-deps .devrun/wheels/*.whl 2>&1 | tail -1
R=$OUT/s7e; mkdir -p $R; date -u +%FT%TZ | tee $R/date.txt
B=$PWD/.devrun/branch-lean; P=$PWD/.devrun/wgprof.py
s=$SECONDS; (cd $B && PYTHONPATH=$B timeout 200 python3 -m pytest -q -n 4 -p xdist tests/test_cuda_hopper_attention.py --maxfail=8 > $R/tests.log 2>&1); echo "== lean tests rc=$? [$((SECONDS-s)) s]" | tee -a $R/date.txt; grep -E "passed|failed|differ" $R/tests.log | tail -6
s=$SECONDS; (cd $B && PYTHONPATH=$B timeout 60 python3 $P > $R/times-lean.txt 2>&1); echo "== lean times [$((SECONDS-s)) s]"; grep -v compil $R/times-lean.txt
s=$SECONDS; (PYTHONPATH=$PWD timeout 60 python3 $P > $R/times-main.txt 2>&1); echo "== main times [$((SECONDS-s)) s]"; grep -v compil $R/times-main.txt
tar czf $OUT/s7e.tgz -C $OUT s7e
