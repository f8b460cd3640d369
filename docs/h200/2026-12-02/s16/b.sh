#!/usr/bin/env bash
# Run b (sixteenth session, second machine): install MLX's CUDA wheel, write the
# Qwen3-1.7B-shaped models and compile their kernels ahead, time the bare decode step's host
# phases at B = 1 and 8 for the 4-bit and bf16 models (host_phases.py) with single projections
# keeping their launch too (the GPU tests run alone afterwards, run g).
set -u
bash .stage2/install > "$OUT/install.log" 2>&1 || { tail -5 "$OUT/install.log"; exit 1; }
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
find bi_rl kernels -type f \( -name '*.py' -o -name '*.cu' -o -name '*.cuh' -o -name '*.h' \) -print0 \
  | sort -z | xargs -0 sha256sum | sha256sum | tee "$OUT/tree.txt"
s=$SECONDS
python3 -c "from pathlib import Path; from bi_rl.bench.e2e import WORKLOADS, write_models; write_models(WORKLOADS['qwen3-1.7b'], Path('/tmp/q17'))" > "$OUT/models.log" 2>&1
echo "models [$((SECONDS - s)) s]"
for m in q4 bf16; do
  s=$SECONDS
  timeout 200 python3 -m bi_rl.cli.verify --warmup --model /tmp/q17/$m > "$OUT/warm_$m.log" 2>&1
  echo "warm-up $m rc=$? [$((SECONDS - s)) s]"; tail -1 "$OUT/warm_$m.log"
done
for m in q4 bf16; do
  s=$SECONDS
  timeout 150 python3 docs/h200/2026-12-02/s16/host_phases.py /tmp/q17 $m > "$OUT/phases_$m.log" 2>&1
  echo "phases $m rc=$? [$((SECONDS - s)) s]"; grep -v "first use" "$OUT/phases_$m.log"
done
