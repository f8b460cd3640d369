# Next session, call 4: main (the checkout: the ninth session's kernels, digest
# caches-digest.txt, plus nn.Linear's shorter host path 4c5a3f8, which has not run on a GPU):
# the CUDA suite, window tests, golden logs and GRPO, then the full bi-verify (resumable: run
# n2.sh again if it stops at its limit; it skips the suite once passed). The 1.7B model is
# written to /tmp/q17 alongside for n3.sh.
set -o pipefail
export PYTHONUNBUFFERED=1 BI_RL_CUDA_CACHE=/tmp/nvrtc-cache MLX_PTX_CACHE_DIR=/tmp/mlx-ptx PYTHONPATH=$PWD
bash .devrun/caches.sh main
python3 -m pip install -q --no-index --no-deps .devrun/wheels/*.whl 2>&1 | tail -1
R=$OUT/n2; mkdir -p $R; date -u +%FT%TZ | tee $R/date.txt
python3 -c "from bi_rl._source import source_digest; print('source', source_digest())" | tee -a $R/date.txt
[ -f /tmp/q17/bf16/config.json ] || (python3 -c "from pathlib import Path; from bi_rl.bench.e2e import WORKLOADS, write_models; write_models(WORKLOADS['qwen3-1.7b'], Path('/tmp/q17'))" > $R/q17.log 2>&1 &)
if [ ! -f /tmp/suite.done ]; then
s=$SECONDS; timeout 330 python3 -m pytest -q -n 8 -p xdist tests/test_cuda_*.py tests/test_attention_window.py tests/test_rollouts_golden.py tests/test_train_grpo.py > $R/tests.log 2>&1; rc=$?; echo "== tests rc=$rc [$((SECONDS-s)) s]" | tee -a $R/date.txt
grep -E "passed|failed|FAILED|Error" $R/tests.log | tail -10; [ $rc = 0 ] && touch /tmp/suite.done
fi
[ -f /tmp/verify.jsonl ] && RES=--resume
s=$SECONDS; timeout 240 python3 -m bi_rl.cli.verify --jobs 12 --log /tmp/verify.jsonl $RES --json $R/verify-full.json > $R/verify-full.log 2>&1; echo "== verify rc=$? [$((SECONDS-s)) s]" | tee -a $R/date.txt
grep -E "PASS|FAIL|Control|compiling" $R/verify-full.log | sort | uniq -c | sort -rn | head -8
cp /tmp/verify.jsonl $R/; gzip -f $R/verify.jsonl $R/verify-full.json $R/verify-full.log
wait; tar czf $OUT/n2.tgz -C $OUT n2
