# The fused-proj branch (.devrun/branch-fp, a git archive without docs/ and rollouts/): one
# launch of the few-row GEMM over sibling projections (hopper.grouped_linear, entries _g2 and
# _g3; not yet run on a GPU) and the opt-in grouping (bi_rl.fusion): the grouped launch
# against each weight's own linear bit for bit and the Hopper GEMM tests, the fusion tests,
# then the bare decode step of the 1.7B shape with and without grouping (ab_group.py).
set -o pipefail
export PYTHONUNBUFFERED=1 BI_RL_CUDA_CACHE=/tmp/nvrtc-fp MLX_PTX_CACHE_DIR=/tmp/mlx-new
bash .devrun/caches.sh fp
R=$OUT/f1; mkdir -p $R; date -u +%FT%TZ | tee $R/date.txt
B=$PWD/.devrun/branch-fp
(cd $B && PYTHONPATH=$B python3 -c "from bi_rl._source import source_digest; print('branch source', source_digest())") | tee -a $R/date.txt
s=$SECONDS; (cd $B && PYTHONPATH=$B timeout 200 python3 -m pytest -q -n 8 -p xdist tests/test_cuda_hopper.py -k "sibling or grouped or few_row or linear_hands" tests/test_fusion.py > $R/tests.log 2>&1); echo "== tests rc=$? [$((SECONDS-s)) s]" | tee -a $R/date.txt; tail -2 $R/tests.log
s=$SECONDS; [ -f /tmp/q17/bf16/config.json ] || python3 -c "from pathlib import Path; from bi_rl.bench.e2e import WORKLOADS, write_models; write_models(WORKLOADS['qwen3-1.7b'], Path('/tmp/q17'))" > /dev/null 2>&1; echo "== model [$((SECONDS-s)) s]" | tee -a $R/date.txt
s=$SECONDS; (cd $B && PYTHONPATH=$B timeout 200 python3 $PWD/.devrun/ab_group.py /tmp/q17 > $R/ab-group.txt 2>&1); echo "== ab rc=$? [$((SECONDS-s)) s]" | tee -a $R/date.txt; grep "^B=" $R/ab-group.txt
gzip -f $R/*.log; tar czf $OUT/f1.tgz -C $OUT f1
