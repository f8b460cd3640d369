set -o pipefail
export PYTHONUNBUFFERED=1 BI_RL_CUDA_CACHE=/tmp/nvrtc-cache MLX_PTX_CACHE_DIR=/tmp/mlx-ptx
[ -d /tmp/nvrtc-cache ] || cp -r .devrun/nvrtc-cache /tmp/nvrtc-cache
python3 -m pip install -q --no-index --no-deps .devrun/wheels/*.whl 2>&1 | tail -1
R=$OUT/n4; mkdir -p $R; date -u +%FT%TZ | tee $R/date.txt
B=$PWD/.devrun/branch-wg; P=$PWD/.devrun/wgprof.py
s=$SECONDS; (cd $B && PYTHONPATH=$B timeout 120 python3 $P > $R/times.txt 2>&1); echo "== times rc=$? [$((SECONDS-s)) s]"; grep -v compil $R/times.txt
s=$SECONDS; (cd $B && PYTHONPATH=$B timeout 200 ncu --profile-from-start off --set full --import-source no python3 $P prof > $R/ncu.txt 2>&1); echo "== ncu rc=$? [$((SECONDS-s)) s]"
grep -E "^  [a-zA-Z_].*\(|Duration|Achieved Occupancy|Registers Per|Compute \(SM\) Throughput|Issue Slots Busy|Warp Cycles Per Issued|No Eligible|Stall|Shared Memory Configuration Size|Dynamic Shared|Block Limit" $R/ncu.txt | head -90
tar czf $OUT/n4.tgz -C $OUT n4
