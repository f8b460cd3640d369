# Session 8, call 4: full bi-verify with branch-comb; one launch of each few-row configuration
# under ncu (GPU time, cold L2); end to end at B = 8 (decode rows on the few-row kernel).
set -o pipefail
export PYTHONUNBUFFERED=1 BI_RL_CUDA_CACHE=/tmp/nvrtc-cache MLX_PTX_CACHE_DIR=/tmp/mlx-ptx
[ -d /tmp/mlx-ptx ] || { mkdir -p /tmp/mlx-ptx && tar xzf .devrun/mlx-cache-s8.tgz -C /tmp && cp -rn /tmp/mlx-cache-s8/. /tmp/mlx-ptx/; }
[ -d /tmp/nvrtc-cache ] || cp -r .devrun/nvrtc-cache /tmp/nvrtc-cache
python3 -m pip install -q --no-index --no-deps .devrun/wheels/*.whl 2>&1 | tail -1
R=$OUT/s8b; mkdir -p $R; date -u +%FT%TZ | tee $R/date.txt
B=$PWD/.devrun/branch-comb
s=$SECONDS; (cd $B && PYTHONPATH=$B timeout 120 python3 -m pytest -q -n 8 -p xdist tests/test_rollouts_golden.py > $R/golden.log 2>&1); echo "== golden rc=$? [$((SECONDS-s)) s]" | tee -a $R/date.txt; tail -1 $R/golden.log
[ -f /tmp/verify.jsonl ] && RES=--resume
s=$SECONDS; (cd $B && PYTHONPATH=$B timeout 300 python3 -m bi_rl.cli.verify --jobs 12 --log /tmp/verify.jsonl $RES --json $R/verify-full.json > $R/verify-full.log 2>&1); echo "== verify rc=$? [$((SECONDS-s)) s]" | tee -a $R/date.txt
cp /tmp/verify.jsonl $R/; gzip -f $R/verify.jsonl $R/verify-full.json
grep -E "PASS|FAIL|Control" $R/verify-full.log
s=$SECONDS; (cd $B && PYTHONPATH=$B timeout 150 ncu --clock-control none --profile-from-start off --metrics gpu__time_duration.sum --csv python3 $PWD/.devrun/narrow_ncu.py > $R/narrow-ncu.csv 2> $R/narrow-ncu.err); echo "== ncu rc=$? [$((SECONDS-s)) s]" | tee -a $R/date.txt; tail -3 $R/narrow-ncu.err; wc -l $R/narrow-ncu.csv
for b in 8; do s=$SECONDS; (cd $B && PYTHONPATH=$B timeout 150 python3 -m bi_rl.cli.bench --only e2e --model-dir /tmp/q17 --batches $b --repeats 3 -v --json $R/e2e-b$b.json > $R/e2e-b$b.log 2>&1); echo "== e2e B=$b rc=$? [$((SECONDS-s)) s]"; grep -vE "compil|\[[0-9]+/" $R/e2e-b$b.log | tail -4; done
tar czf $OUT/s8b.tgz -C $OUT s8b
