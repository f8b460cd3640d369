# Next session, first call after staging: the attn-order branch (.devrun/branch-ao, a git
# archive of 341298e without docs/ and rollouts/: the wgmma prefill attention's blocks take
# their row groups longest first; not yet run on a GPU): its wgmma attention GPU tests (bit
# for bit against the mma.sync kernel), then bi-bench's attention cases on the branch and on
# main, each against stock in its own process.
set -o pipefail
export PYTHONUNBUFFERED=1 BI_RL_CUDA_CACHE=/tmp/nvrtc-ao MLX_PTX_CACHE_DIR=/tmp/mlx-new
bash .devrun/caches.sh main; bash .devrun/caches.sh ao
R=$OUT/a1; mkdir -p $R; date -u +%FT%TZ | tee $R/date.txt
B=$PWD/.devrun/branch-ao
(cd $B && PYTHONPATH=$B python3 -c "from bi_rl._source import source_digest; print('branch source', source_digest())") | tee -a $R/date.txt
s=$SECONDS; (cd $B && PYTHONPATH=$B timeout 240 python3 -m pytest -q -n 8 -p xdist tests/test_cuda_hopper_attention.py > $R/tests.log 2>&1); echo "== branch attention tests rc=$? [$((SECONDS-s)) s]" | tee -a $R/date.txt; tail -2 $R/tests.log
s=$SECONDS; (cd $B && PYTHONPATH=$B timeout 150 python3 -m bi_rl.cli.bench --only attention -v --json $R/attn-branch.json > $R/attn-branch.log 2>&1); echo "== branch bench rc=$? [$((SECONDS-s)) s]" | tee -a $R/date.txt; grep -i prefill $R/attn-branch.log | tail -8
s=$SECONDS; BI_RL_CUDA_CACHE=/tmp/nvrtc-new PYTHONPATH=$PWD timeout 150 python3 -m bi_rl.cli.bench --only attention -v --json $R/attn-main.json > $R/attn-main.log 2>&1; echo "== main bench rc=$? [$((SECONDS-s)) s]" | tee -a $R/date.txt; grep -i prefill $R/attn-main.log | tail -8
gzip -f $R/*.log; tar czf $OUT/a1.tgz -C $OUT a1
