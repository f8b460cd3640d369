# Next session: main on the GPU: the four CPU tests fixed after this session's run 4 (and
# the rest of their modules), the CUDA suite, window tests, golden logs and GRPO. No NVRTC
# cache (every key moved with af78673): expect a few minutes of first-use compiles; run
# bi-verify in a call of its own afterwards (`bi-verify --jobs 12 --json ...`).
set -o pipefail
export PYTHONUNBUFFERED=1 BI_RL_CUDA_CACHE=/tmp/nvrtc-new MLX_PTX_CACHE_DIR=/tmp/mlx-new PYTHONPATH=$PWD
bash .devrun/caches.sh main
R=$OUT/m1; mkdir -p $R; date -u +%FT%TZ | tee $R/date.txt
s=$SECONDS; timeout 150 python3 -m pytest -q -n 8 -p xdist tests/test_engine.py tests/test_mode.py tests/test_generate.py tests/test_sampler.py tests/test_logprobs.py > $R/cpu-tests-on-gpu.log 2>&1; echo "== engine/mode/generate tests rc=$? [$((SECONDS-s)) s]" | tee -a $R/date.txt; tail -2 $R/cpu-tests-on-gpu.log
s=$SECONDS; timeout 400 python3 -m pytest -q -n 8 -p xdist tests/test_cuda_*.py tests/test_attention_window.py tests/test_rollouts_golden.py tests/test_train_grpo.py > $R/tests.log 2>&1; echo "== suite rc=$? [$((SECONDS-s)) s]" | tee -a $R/date.txt; tail -2 $R/tests.log
gzip -f $R/*.log; tar czf $OUT/m1.tgz -C $OUT m1
