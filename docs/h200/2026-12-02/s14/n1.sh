# One-warp few-row GEMM blocks against the dispatcher's pick (narrow_one.py), twice.
export PYTHONUNBUFFERED=1 BI_RL_CUDA_CACHE=/tmp/nvrtc
R=$OUT/n1; mkdir -p $R; git log -1 --format=%h > $R/tree.txt 2>/dev/null
date -u +%FT%TZ | tee $R/date.txt
for i in 1 2; do
  PYTHONPATH=$PWD timeout 200 python3 docs/h200/2026-12-02/s14/narrow_one.py > $R/narrow-$i.log 2>&1
  echo "round $i rc=$?"; cat $R/narrow-$i.log | cut -c1-400
done
