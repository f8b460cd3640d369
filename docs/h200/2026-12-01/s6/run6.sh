# Sixth session, last call: the overlapped wgmma prefill kernel (main 947e823) against the
# mma.sync kernel bit for bit, its times beside mma.sync and stock, the attention bench and
# long rescoring with it on, and one ncu launch each.
set -o pipefail
export PYTHONUNBUFFERED=1 BI_RL_CUDA_CACHE=/tmp/nvrtc-cache PYTHONPATH=$PWD
[ -d /tmp/nvrtc-cache ] || cp -r .devrun/nvrtc-cache /tmp/nvrtc-cache
python3 -m pip install -q --no-index --no-deps .devrun/wheels/*.whl 2>&1 | tail -1
R=$OUT/n5; mkdir -p $R; date -u +%FT%TZ | tee $R/date.txt
python3 -c "from bi_rl._source import source_digest; print('source', source_digest())" | tee -a $R/date.txt
(python3 -c "from pathlib import Path; from bi_rl.bench.e2e import WORKLOADS, write_models; write_models(WORKLOADS['qwen3-1.7b'], Path('/tmp/q17'))" > $R/q17.log 2>&1) &
s=$SECONDS; timeout 200 python3 -m pytest -q -n 4 -p xdist tests/test_cuda_hopper_attention.py --maxfail=8 > $R/wg-tests.log 2>&1; echo "== wg tests rc=$? [$((SECONDS-s)) s]" | tee -a $R/date.txt; grep -E "differ|passed|failed" $R/wg-tests.log | tail -8
s=$SECONDS; timeout 60 python3 .devrun/wgprof.py > $R/times.txt 2>&1; echo "== times rc=$? [$((SECONDS-s)) s]" | tee -a $R/date.txt; grep -v compil $R/times.txt
s=$SECONDS; BI_RL_HOPPER_ATTENTION=1 timeout 110 python3 -m bi_rl.cli.bench --only attention --json $R/attn-wg.json > $R/attn-wg.log 2>&1; echo "== bench rc=$? [$((SECONDS-s)) s]" | tee -a $R/date.txt; grep -E "prefill" $R/attn-wg.log
wait
for e in 0 1; do s=$SECONDS; BI_RL_HOPPER_ATTENTION=$e timeout 60 python3 -m bi_rl.cli.bench --only rescore-long --model-dir /tmp/q17 --repeats 3 --json $R/rescore-long-wg$e.json > $R/rescore-long-wg$e.log 2>&1; echo "== rescore-long wg=$e rc=$? [$((SECONDS-s)) s]" | tee -a $R/date.txt; tail -4 $R/rescore-long-wg$e.log; done
s=$SECONDS; timeout 60 ncu --profile-from-start off --set full --import-source no python3 .devrun/wgprof.py prof > $R/ncu.txt 2>&1; echo "== ncu rc=$? [$((SECONDS-s)) s]"
grep -E "^  [a-zA-Z_].*\(|Duration|Issue Slots Busy|No Eligible|Registers Per|Issued Instructions  |highest-utilized" $R/ncu.txt | cut -c1-150 | head -40
gzip -f $R/ncu.txt; tar czf $OUT/n5.tgz -C $OUT n5
