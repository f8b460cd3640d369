# Next session, call 3 (after staging): the narrow-lean branch (.devrun/branch-nl: the few-row
# GEMM with carried copy pointers and ldmatrix addresses): its GPU tests against every wgmma
# configuration, then GPU time of one launch of each configuration under ncu (as run 8 of the
# seventh session) and one `ncu --set full` at M = 1, K = 14336, N = 4096 (as its run 9).
set -o pipefail
export PYTHONUNBUFFERED=1 BI_RL_CUDA_CACHE=/tmp/nvrtc-cache MLX_PTX_CACHE_DIR=/tmp/mlx-ptx
[ -d /tmp/mlx-ptx ] || { mkdir -p /tmp/mlx-ptx && tar xzf .devrun/mlx-cache-s9.tgz -C /tmp && cp -rn /tmp/mlx-cache-s9/. /tmp/mlx-ptx/; }
[ -d /tmp/nvrtc-cache ] || cp -r .devrun/nvrtc-cache /tmp/nvrtc-cache
python3 -m pip install -q --no-index --no-deps .devrun/wheels/*.whl 2>&1 | tail -1
R=$OUT/n1; mkdir -p $R; date -u +%FT%TZ | tee $R/date.txt
B=$PWD/.devrun/branch-nl; D=$PWD/.devrun
(cd $B && PYTHONPATH=$B python3 -c "from bi_rl._source import source_digest; print('source', source_digest())") | tee -a $R/date.txt
(cd $B && PYTHONPATH=$B python3 -c "from pathlib import Path; from bi_rl.bench.e2e import WORKLOADS, write_models; write_models(WORKLOADS['qwen3-1.7b'], Path('/tmp/q17'))" > $R/q17.log 2>&1) &
s=$SECONDS; (cd $B && PYTHONPATH=$B timeout 200 python3 -m pytest -q -n 4 -p xdist tests/test_cuda_hopper.py -k "few_row or every_configuration_and_batch or any_rank" > $R/tests.log 2>&1); echo "== narrow tests rc=$? [$((SECONDS-s)) s]" | tee -a $R/date.txt; grep -E "passed|failed|differ" $R/tests.log | tail -6
s=$SECONDS; (cd $B && PYTHONPATH=$B timeout 150 ncu --clock-control none --profile-from-start off --metrics gpu__time_duration.sum --csv python3 $D/narrow_ncu.py > $R/narrow-ncu.csv 2> $R/narrow-ncu.err); echo "== ncu rc=$? [$((SECONDS-s)) s]" | tee -a $R/date.txt
gzip -f $R/narrow-ncu.csv; python3 $D/ncu_table.py $R/narrow-ncu.csv.gz > $R/narrow-ncu-table.txt 2>&1
cat $R/narrow-ncu-table.txt
s=$SECONDS; (cd $B && PYTHONPATH=$B timeout 120 ncu --clock-control none --profile-from-start off --set full python3 $D/narrow_prof.py > $R/narrow-prof.txt 2> $R/narrow-prof.err); echo "== prof rc=$? [$((SECONDS-s)) s]"
grep -E "Duration|DRAM Throughput|Executed Instructions  |Warp Cycles Per Issued" $R/narrow-prof.txt | head -8
gzip -f $R/narrow-prof.txt; wait; tar czf $OUT/n1.tgz -C $OUT n1
