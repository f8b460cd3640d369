# Call 4: main with the dedup kernels (af78673) and the engine's shorter step head (b3ea1ad):
# the engine's per-step head before/after in one process (ab_engine.py, 1.7B shape, B = 1
# and 8), end to end at B = 1 and 8, then the engine, mode, sampler, logprob, generate and
# golden-log tests on the GPU. Kernels: MLX's for the e2e workload from an offline cache
# (mlx-cache-e2e, built for kernels digest a6b91703249c7654); NVRTC compiles on first use.
set -o pipefail
export PYTHONUNBUFFERED=1 BI_RL_CUDA_CACHE=/tmp/nvrtc-new MLX_PTX_CACHE_DIR=/tmp/mlx-new PYTHONPATH=$PWD
[ -d /tmp/mlx-new ] || { mkdir -p /tmp/mlx-new && cp -r .devrun/mlx-cache-e2e/. /tmp/mlx-new/; }
R=$OUT/n4; mkdir -p $R; date -u +%FT%TZ | tee $R/date.txt
python3 -c "from bi_rl._source import source_digest; from bi_rl.backends.cuda._kernels import files_digest; print('source', source_digest(), 'kernels', files_digest())" | tee -a $R/date.txt
s=$SECONDS; [ -f /tmp/q17/bf16/config.json ] || python3 -c "from pathlib import Path; from bi_rl.bench.e2e import WORKLOADS, write_models; write_models(WORKLOADS['qwen3-1.7b'], Path('/tmp/q17'))" > $R/q17.log 2>&1; echo "== model [$((SECONDS-s)) s]" | tee -a $R/date.txt
s=$SECONDS; timeout 200 python3 .devrun/ab_engine.py /tmp/q17 bare,old,held,shared,read,new > $R/ab-engine.txt 2>&1; echo "== ab rc=$? [$((SECONDS-s)) s]" | tee -a $R/date.txt; grep -E "^B=|^read" $R/ab-engine.txt
s=$SECONDS; timeout 120 python3 -m bi_rl.cli.bench --only e2e --model-dir /tmp/q17 --batches 1 --repeats 3 -v --json $R/e2e-b1.json > $R/e2e-b1.log 2>&1; echo "== e2e B=1 rc=$? [$((SECONDS-s)) s]" | tee -a $R/date.txt; grep -vE "compil|\[[0-9]+/" $R/e2e-b1.log | tail -2
s=$SECONDS; timeout 170 python3 -m pytest -q -n 4 -p xdist tests/test_engine.py tests/test_mode.py tests/test_sampler.py tests/test_logprobs.py tests/test_generate.py tests/test_rollouts_golden.py > $R/tests.log 2>&1; echo "== tests rc=$? [$((SECONDS-s)) s]" | tee -a $R/date.txt; tail -3 $R/tests.log
s=$SECONDS; timeout 120 python3 -m bi_rl.cli.bench --only e2e --model-dir /tmp/q17 --batches 8 --repeats 3 -v --json $R/e2e-b8.json > $R/e2e-b8.log 2>&1; echo "== e2e B=8 rc=$? [$((SECONDS-s)) s]" | tee -a $R/date.txt; grep -vE "compil|\[[0-9]+/" $R/e2e-b8.log | tail -2
gzip -f $R/*.log; tar czf $OUT/n4.tgz -C $OUT n4
