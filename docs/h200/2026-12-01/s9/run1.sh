# Next session, call 3 (after staging): the narrow-pipe branch (.devrun/branch-np: the few-row
# GEMM reading each k16 step's fragments one step ahead, across k-tiles): its GPU tests against
# every wgmma configuration, GPU time of one launch of each configuration under ncu (as run 1
# of docs/h200/2026-12-01/s8) and ncu --set full at M = 1, K = 14336, N = 4096 of the 16- and
# 32-column kernels and stock's GEMV (s8 run 1: 32 columns 47.5 us, 8.73 M instructions);
# then the decode attention split configurations at B = 1-8 over long contexts (attn_spb.py).
set -o pipefail
export PYTHONUNBUFFERED=1 BI_RL_CUDA_CACHE=/tmp/nvrtc-cache MLX_PTX_CACHE_DIR=/tmp/mlx-ptx
bash .devrun/caches.sh
python3 -m pip install -q --no-index --no-deps .devrun/wheels/*.whl 2>&1 | tail -1
R=$OUT/p1; mkdir -p $R; date -u +%FT%TZ | tee $R/date.txt
B=$PWD/.devrun/branch-np; D=$PWD/.devrun
(cd $B && PYTHONPATH=$B python3 -c "from bi_rl._source import source_digest; print('source', source_digest())") | tee -a $R/date.txt
(cd $B && PYTHONPATH=$B python3 -c "from pathlib import Path; from bi_rl.bench.e2e import WORKLOADS, write_models; write_models(WORKLOADS['qwen3-1.7b'], Path('/tmp/q17'))" > $R/q17.log 2>&1) &
s=$SECONDS; (cd $B && PYTHONPATH=$B timeout 200 python3 -m pytest -q -n 4 -p xdist tests/test_cuda_hopper.py -k "few_row or every_configuration_and_batch or any_rank" > $R/tests.log 2>&1); echo "== narrow tests rc=$? [$((SECONDS-s)) s]" | tee -a $R/date.txt; grep -E "passed|failed|differ" $R/tests.log | tail -6
s=$SECONDS; (cd $B && PYTHONPATH=$B timeout 150 ncu --clock-control none --profile-from-start off --metrics gpu__time_duration.sum --csv python3 $D/narrow_ncu.py > $R/narrow-ncu.csv 2> $R/narrow-ncu.err); echo "== ncu rc=$? [$((SECONDS-s)) s]" | tee -a $R/date.txt
gzip -f $R/narrow-ncu.csv; python3 $D/ncu_table.py $R/narrow-ncu.csv.gz > $R/narrow-ncu-table.txt 2>&1
cat $R/narrow-ncu-table.txt
s=$SECONDS; (cd $B && PYTHONPATH=$B timeout 120 ncu --clock-control none --profile-from-start off --set full python3 $D/narrow_prof2.py > $R/narrow-prof.txt 2> $R/narrow-prof.err); echo "== prof rc=$? [$((SECONDS-s)) s]"
grep -E "Duration|DRAM Throughput|Executed Instructions  |Warp Cycles Per Issued" $R/narrow-prof.txt | head -12
gzip -f $R/narrow-prof.txt
# decode attention at B = 1, 2, 8 over 32768 / 131072 keys, every split configuration forced
# (the sixth session's lead: 16 splits a block faster at B = 1-2 over 32768 keys; re-time it)
s=$SECONDS; (cd $B && PYTHONPATH=$B timeout 100 python3 $D/attn_spb.py > $R/attn-spb.txt 2>&1); echo "== attn spb rc=$? [$((SECONDS-s)) s]" | tee -a $R/date.txt; grep "dispatcher\|16)" $R/attn-spb.txt | head -12
wait; tar czf $OUT/p1.tgz -C $OUT p1
