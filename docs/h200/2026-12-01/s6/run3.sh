# Next session, call 5: CUDA graph nodes per decode step (strict, off) and the host phases
# at B = 8 and 128 (main).
set -o pipefail
export PYTHONUNBUFFERED=1 BI_RL_CUDA_CACHE=/tmp/nvrtc-cache MLX_PTX_CACHE_DIR=/tmp/mlx-ptx PYTHONPATH=$PWD
R=$OUT/n3; mkdir -p $R; date -u +%FT%TZ | tee $R/date.txt
for m in strict off; do
  mkdir -p /tmp/dots/$m
  MLX_SAVE_CUDA_GRAPHS_DOT_FILE=/tmp/dots/$m/g timeout 120 python3 .devrun/nodes.py $m 64 2>&1 | grep -v compil | tee -a $R/nodes.txt
done
ls /tmp/dots/strict | tail -3; tar czf $R/dots-last.tgz -C /tmp dots 2>/dev/null; ls -la $R
for b in 8 128; do
  s=$SECONDS; timeout 150 python3 tools/engine_profile.py --model-dir /tmp/q17 --batch $b --steps 96 --phases-only --json $R/phases-b$b.json > $R/phases-b$b.log 2>&1; echo "== phases B=$b rc=$? [$((SECONDS-s)) s]"
  grep -A5 "host phases" $R/phases-b$b.log
done
s=$SECONDS; timeout 150 python3 .devrun/attn_spb.py 2>&1 | grep -v compil | tee $R/attn-spb.txt; echo "== spb [$((SECONDS-s)) s]"
tar czf $OUT/n3.tgz -C $OUT n3
