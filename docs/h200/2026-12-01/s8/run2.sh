# Next session, call 4 (if call 3 passed): the narrow-lean branch through the CUDA test suite,
# the window tests, the H200 golden logs and GRPO, then the full bi-verify.
set -o pipefail
export PYTHONUNBUFFERED=1 BI_RL_CUDA_CACHE=/tmp/nvrtc-cache MLX_PTX_CACHE_DIR=/tmp/mlx-ptx
[ -d /tmp/mlx-ptx ] || { mkdir -p /tmp/mlx-ptx && tar xzf .devrun/mlx-cache-s9.tgz -C /tmp && cp -rn /tmp/mlx-cache-s9/. /tmp/mlx-ptx/; }
[ -d /tmp/nvrtc-cache ] || cp -r .devrun/nvrtc-cache /tmp/nvrtc-cache
python3 -m pip install -q --no-index --no-deps .devrun/wheels/*.whl 2>&1 | tail -1
R=$OUT/n2; mkdir -p $R; date -u +%FT%TZ | tee $R/date.txt
B=$PWD/.devrun/branch-nl
s=$SECONDS; (cd $B && PYTHONPATH=$B timeout 330 python3 -m pytest -q -n 8 -p xdist tests/test_cuda_*.py tests/test_attention_window.py tests/test_rollouts_golden.py tests/test_train_grpo.py > $R/tests.log 2>&1); echo "== tests rc=$? [$((SECONDS-s)) s]" | tee -a $R/date.txt
grep -E "passed|failed|FAILED|Error" $R/tests.log | tail -10
[ -f /tmp/verify.jsonl ] && RES=--resume
s=$SECONDS; (cd $B && PYTHONPATH=$B timeout 220 python3 -m bi_rl.cli.verify --jobs 12 --log /tmp/verify.jsonl $RES --json $R/verify-full.json > $R/verify-full.log 2>&1); echo "== verify rc=$? [$((SECONDS-s)) s]" | tee -a $R/date.txt
grep -E "PASS|FAIL|Control" $R/verify-full.log
cp /tmp/verify.jsonl $R/; gzip -f $R/verify.jsonl $R/verify-full.json $R/verify-full.log
tar czf $OUT/n2.tgz -C $OUT n2
