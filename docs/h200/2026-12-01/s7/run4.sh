# Next session, call 6 (if time): the few-row GEMM on mma.sync (main, BI_RL_HOPPER_NARROW):
# its GPU tests against the wgmma configurations, then its times beside wgmma and stock.
set -o pipefail
export PYTHONUNBUFFERED=1 BI_RL_CUDA_CACHE=/tmp/nvrtc-cache MLX_PTX_CACHE_DIR=/tmp/mlx-ptx PYTHONPATH=$PWD
[ -d /tmp/mlx-ptx ] || { mkdir -p /tmp/mlx-ptx && tar xzf .devrun/mlx-cache-s7.tgz -C /tmp && cp -rn /tmp/mlx-cache-s7/. /tmp/mlx-ptx/; }
[ -d /tmp/nvrtc-cache ] || cp -r .devrun/nvrtc-cache /tmp/nvrtc-cache
python3 -m pip install -q --no-index --no-deps .devrun/wheels/*.whl 2>&1 | tail -1
R=$OUT/s7d; mkdir -p $R; date -u +%FT%TZ | tee $R/date.txt
s=$SECONDS; timeout 300 python3 -m pytest -q -n 4 -p xdist tests/test_cuda_hopper.py -k "few_row or every_configuration_and_batch or any_rank" > $R/tests.log 2>&1; echo "== narrow tests rc=$? [$((SECONDS-s)) s]" | tee -a $R/date.txt; grep -E "passed|failed|differ" $R/tests.log | tail -8
s=$SECONDS; timeout 200 python3 .devrun/narrow_time.py > $R/times.txt 2>&1; echo "== times rc=$? [$((SECONDS-s)) s]"; grep -v compil $R/times.txt
tar czf $OUT/s7d.tgz -C $OUT s7d
