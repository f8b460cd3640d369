# Main (aea011a) on the GPU, tests and the full bi-verify side by side (both are checks of
# bits, not timings, so they may share the machine): the CUDA suite, window tests, H200
# golden logs, GRPO, fusion (grouping on by default on Hopper), engine/mode/generate;
# bi-verify --jobs 10 logging each check to /tmp/verify.jsonl so a later call resumes it.
# No kernel caches on this fresh machine: kernels compile on first use.
set -o pipefail
export PYTHONUNBUFFERED=1 BI_RL_CUDA_CACHE=/tmp/nvrtc-new MLX_PTX_CACHE_DIR=/tmp/mlx-new PYTHONPATH=$PWD
mkdir -p /tmp/nvrtc-new /tmp/mlx-new
R=$OUT/e1; mkdir -p $R; date -u +%FT%TZ | tee $R/date.txt; git log -1 --format=%h >> $R/date.txt 2>/dev/null
(python3 -c "from pathlib import Path; from bi_rl.bench.e2e import WORKLOADS, write_models; write_models(WORKLOADS['qwen3-1.7b'], Path('/tmp/q17'))" > $R/q17.log 2>&1 &)
T=${1:-500}
(s=$SECONDS; timeout $T python3 -m pytest -q -n 6 -p xdist tests/test_cuda_*.py tests/test_attention_window.py tests/test_rollouts_golden.py tests/test_train_grpo.py tests/test_fusion.py tests/test_engine.py tests/test_mode.py tests/test_generate.py > $R/tests.log 2>&1; echo "== tests rc=$? [$((SECONDS-s)) s]" >> $R/date.txt) &
s=$SECONDS; timeout $T python3 -m bi_rl.cli.verify --jobs 10 --log /tmp/verify.jsonl --resume --json $R/verify.json > $R/verify.log 2>&1; echo "== verify rc=$? [$((SECONDS-s)) s]" >> $R/date.txt
wait
cat $R/date.txt; tail -3 $R/tests.log; tail -4 $R/verify.log; wc -l /tmp/verify.jsonl
cp /tmp/verify.jsonl $R/ 2>/dev/null
gzip -f $R/*.log $R/verify.jsonl; tar czf $OUT/e1.tgz -C $OUT e1
