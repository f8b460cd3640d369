# Next session, call 3 (after staging): the attn-wgmma-default branch (.devrun/branch-def, a git
# archive of it): the CUDA test suite, the H200 golden-log test and GRPO with the wgmma prefill
# attention on by default; the 1.7B model written alongside for the later calls.
set -o pipefail
export PYTHONUNBUFFERED=1 BI_RL_CUDA_CACHE=/tmp/nvrtc-cache MLX_PTX_CACHE_DIR=/tmp/mlx-ptx
[ -d /tmp/mlx-ptx ] || { mkdir -p /tmp/mlx-ptx && tar xzf .devrun/mlx-cache-s7.tgz -C /tmp && cp -rn /tmp/mlx-cache-s7/. /tmp/mlx-ptx/; }
[ -d /tmp/nvrtc-cache ] || cp -r .devrun/nvrtc-cache /tmp/nvrtc-cache
python3 -m pip install -q --no-index --no-deps .devrun/wheels/*.whl 2>&1 | tail -1
R=$OUT/s7a; mkdir -p $R; date -u +%FT%TZ | tee $R/date.txt
B=$PWD/.devrun/branch-def
(cd $B && PYTHONPATH=$B python3 -c "from bi_rl._source import source_digest; print('source', source_digest())") | tee -a $R/date.txt
(cd $B && PYTHONPATH=$B python3 -c "from pathlib import Path; from bi_rl.bench.e2e import WORKLOADS, write_models; write_models(WORKLOADS['qwen3-1.7b'], Path('/tmp/q17'))" > $R/q17.log 2>&1) &
s=$SECONDS; (cd $B && PYTHONPATH=$B timeout 480 python3 -m pytest -q -n 8 -p xdist tests/test_cuda_*.py tests/test_attention_window.py tests/test_rollouts_golden.py tests/test_train_grpo.py > $R/tests.log 2>&1); echo "== tests rc=$? [$((SECONDS-s)) s]" | tee -a $R/date.txt
grep -E "passed|failed|FAILED|Error" $R/tests.log | tail -15
wait; tar czf $OUT/s7a.tgz -C $OUT s7a
