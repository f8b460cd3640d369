# Next session, FIRST call after staging: do mma.sync and wgmma chains give the same bits
# (tools/mma_equiv.cu)? Then the attn-wgmma branch (.devrun/branch-wg, git archive of it):
# its Hopper attention tests against the mma.sync kernel, and the attention bench with the
# wgmma prefill on (BI_RL_HOPPER_ATTENTION=1) beside main's figures.
set -o pipefail
export PYTHONUNBUFFERED=1 BI_RL_CUDA_CACHE=/tmp/nvrtc-cache
[ -d /tmp/nvrtc-cache ] || cp -r .devrun/nvrtc-cache /tmp/nvrtc-cache
python3 -m pip install -q --no-index --no-deps .devrun/wheels/*.whl 2>&1 | tail -1
R=$OUT/n0; mkdir -p $R; date -u +%FT%TZ | tee $R/date.txt
nvcc -std=c++17 -gencode arch=compute_90a,code=sm_90a -O2 -o /tmp/mma_equiv tools/mma_equiv.cu && timeout 60 /tmp/mma_equiv > $R/mma-equiv.txt 2>&1; echo "== mma_equiv rc=$?" | tee -a $R/date.txt; tail -3 $R/mma-equiv.txt
B=$PWD/.devrun/branch-wg
s=$SECONDS; (cd $B && PYTHONPATH=$B timeout 120 python3 -m pytest -q -n 4 -p xdist tests/test_cuda_hopper_attention.py -k decode_row > $R/wg-self.log 2>&1); echo "== wg self-consistency rc=$? [$((SECONDS-s)) s]" | tee -a $R/date.txt; tail -6 $R/wg-self.log
s=$SECONDS; (cd $B && PYTHONPATH=$B timeout 240 python3 -m pytest -q -n 4 -p xdist tests/test_cuda_hopper_attention.py --maxfail=8 -k "not decode_row" > $R/wg-tests.log 2>&1); echo "== wg vs mma.sync rc=$? [$((SECONDS-s)) s]" | tee -a $R/date.txt; grep -E "differ|passed|failed" $R/wg-tests.log | tail -12
s=$SECONDS; (cd $B && BI_RL_HOPPER_ATTENTION=1 PYTHONPATH=$B timeout 180 python3 -m bi_rl.cli.bench --only attention --json $R/attn-wg.json > $R/attn-wg.log 2>&1); echo "== wg bench rc=$? [$((SECONDS-s)) s]" | tee -a $R/date.txt; grep -E "prefill" $R/attn-wg.log
tar czf $OUT/n0.tgz -C $OUT n0
