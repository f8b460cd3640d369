#!/usr/bin/env bash
# Run c2 (fifteenth session): install MLX's CUDA wheel, then side by side
#   - every GPU test file (tools/cuda_device_run.sh gpu), in the background;
#   - the Qwen3-1.7B-shaped models written, their kernels compiled ahead (bi-verify --warmup),
#     and the bounded-head rescoring at batch 16/32/64 in both modes (score_fail.py).
# Tests check bits, not speed, so they may share the GPU with the warm-up and the scoring.
set -u
bash .stage2/install > "$OUT/install.log" 2>&1 || { tail -5 "$OUT/install.log"; exit 1; }
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
git log --oneline -1 2>/dev/null | tee "$OUT/head.txt"
find bi_rl kernels -type f \( -name '*.py' -o -name '*.cu' -o -name '*.cuh' -o -name '*.h' \) -print0 \
  | sort -z | xargs -0 sha256sum | sha256sum | tee -a "$OUT/head.txt"
JOBS=6 bash tools/cuda_device_run.sh "$OUT/c" gpu > "$OUT/c.log" 2>&1 &
tests=$!
s=$SECONDS
python3 -c "from pathlib import Path; from bi_rl.bench.e2e import WORKLOADS, write_models; write_models(WORKLOADS['qwen3-1.7b'], Path('/tmp/q17'))" > "$OUT/models.log" 2>&1
echo "models [$((SECONDS - s)) s]"
for m in q4 bf16; do
  s=$SECONDS
  timeout 240 python3 -m bi_rl.cli.verify --warmup --model /tmp/q17/$m > "$OUT/warm_$m.log" 2>&1
  echo "warm-up $m rc=$? [$((SECONDS - s)) s]"; tail -2 "$OUT/warm_$m.log"
done
s=$SECONDS
timeout 240 python3 docs/h200/2026-12-02/s14/score_fail.py /tmp/q17/q4 > "$OUT/score.log" 2>&1
echo "score rc=$? [$((SECONDS - s)) s]"; cat "$OUT/score.log" | grep -v "first use" | tail -12
grep -c "first use" "$OUT/score.log"
grep "first use" "$OUT/score.log" | grep -ciE "gemm|qmm"
wait $tests
cat "$OUT/c.log"
