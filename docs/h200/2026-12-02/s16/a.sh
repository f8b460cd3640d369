#!/usr/bin/env bash
# Run a (sixteenth session): install MLX's CUDA wheel, write the Qwen3-1.7B-shaped models,
# compile their kernels ahead, time the bare 4-bit decode step's host phases at B = 1 and 8
# (../s15/next/host_phases_q4.py) with groups keeping their launch, then the fusion, engine
# and generate GPU tests on this tree (the kept launch's refactor, 6c0acb4, had not run there).
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
s=$SECONDS
timeout 150 python3 docs/h200/2026-12-02/s15/next/host_phases_q4.py /tmp/q17 > "$OUT/phases.log" 2>&1
echo "phases rc=$? [$((SECONDS - s)) s]"; cat "$OUT/phases.log"
s=$SECONDS
timeout 170 python3 -m pytest -q -x -p no:cacheprovider tests/test_fusion.py tests/test_engine.py tests/test_generate.py > "$OUT/tests.log" 2>&1
echo "tests rc=$? [$((SECONDS - s)) s]"; tail -3 "$OUT/tests.log"
