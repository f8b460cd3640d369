# Next session, call 3 (after staging): the narrow-kt2 branch (.devrun/branch-ts, a git archive
# without docs/ and rollouts/; it holds tile-share's two kernel dedups and, on top, the few-row
# GEMM's option of two k-tiles a stage, NARROW_KT2, tested but not picked): the few-row GPU
# tests against every wgmma configuration (the 128-column few-row kernel's SASS differs from
# main's by register allocation, the two-k-tile kernels are new; every other GEMM kernel is
# byte-identical PTX), then GPU time of one launch of each few-row configuration under ncu,
# the two-k-tile ones as extra columns (compare with docs/h200/2026-12-01/s9/run1).
set -o pipefail
export PYTHONUNBUFFERED=1 BI_RL_CUDA_CACHE=/tmp/nvrtc-ts MLX_PTX_CACHE_DIR=/tmp/mlx-ts
bash .devrun/caches.sh ts; mkdir -p /tmp/mlx-ts
python3 -m pip install -q --no-index --no-deps .devrun/wheels/*.whl 2>&1 | tail -1
R=$OUT/n1; mkdir -p $R; date -u +%FT%TZ | tee $R/date.txt
B=$PWD/.devrun/branch-ts; D=$PWD/.devrun
(cd $B && PYTHONPATH=$B python3 -c "from bi_rl._source import source_digest; print('source', source_digest())") | tee -a $R/date.txt
s=$SECONDS; (cd $B && PYTHONPATH=$B timeout 260 python3 -m pytest -q -n 4 -p xdist tests/test_cuda_hopper.py -k "few_row or every_configuration_and_batch or any_rank or operand_forms" > $R/tests.log 2>&1); echo "== tile-share tests rc=$? [$((SECONDS-s)) s]" | tee -a $R/date.txt; grep -E "passed|failed|differ" $R/tests.log | tail -6
s=$SECONDS; (cd $B && PYTHONPATH=$B timeout 150 ncu --clock-control none --profile-from-start off --metrics gpu__time_duration.sum --csv python3 $D/narrow_ncu.py > $R/narrow-ncu.csv 2> $R/narrow-ncu.err); echo "== ncu rc=$? [$((SECONDS-s)) s]" | tee -a $R/date.txt
gzip -f $R/narrow-ncu.csv; python3 $D/ncu_table.py $R/narrow-ncu.csv.gz > $R/narrow-ncu-table.txt 2>&1; cat $R/narrow-ncu-table.txt
tar czf $OUT/n1.tgz -C $OUT n1
