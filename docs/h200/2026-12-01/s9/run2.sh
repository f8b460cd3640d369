# Next session, call 4 (if call 3 passed): narrow-pipe through the CUDA test suite, the window
# tests, the H200 golden logs and GRPO, then the full bi-verify (resumable: run again with the
# same /tmp/verify.jsonl if it stops at its limit).
set -o pipefail
export PYTHONUNBUFFERED=1 BI_RL_CUDA_CACHE=/tmp/nvrtc-cache MLX_PTX_CACHE_DIR=/tmp/mlx-ptx
bash .devrun/caches.sh
R=$OUT/p2; mkdir -p $R; date -u +%FT%TZ | tee $R/date.txt
B=$PWD/.devrun/branch-np
if [ ! -f /tmp/suite.done ]; then
s=$SECONDS; (cd $B && PYTHONPATH=$B timeout 330 python3 -m pytest -q -n 8 -p xdist tests/test_cuda_*.py tests/test_attention_window.py tests/test_rollouts_golden.py tests/test_train_grpo.py > $R/tests.log 2>&1); rc=$?; echo "== tests rc=$rc [$((SECONDS-s)) s]" | tee -a $R/date.txt
grep -E "passed|failed|FAILED|Error" $R/tests.log | tail -10; [ $rc = 0 ] && touch /tmp/suite.done
fi
[ -f /tmp/verify.jsonl ] && RES=--resume
s=$SECONDS; (cd $B && PYTHONPATH=$B timeout 240 python3 -m bi_rl.cli.verify --jobs 12 --log /tmp/verify.jsonl $RES --json $R/verify-full.json > $R/verify-full.log 2>&1); echo "== verify rc=$? [$((SECONDS-s)) s]" | tee -a $R/date.txt
grep -E "PASS|FAIL|Control|compiling" $R/verify-full.log | sort | uniq -c | sort -rn | head -8
cp /tmp/verify.jsonl $R/; gzip -f $R/verify.jsonl $R/verify-full.json $R/verify-full.log
tar czf $OUT/p2.tgz -C $OUT p2
