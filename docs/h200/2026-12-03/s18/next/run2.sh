#!/usr/bin/env bash
# For the next device session, right after run.sh on the same machine: long-context rescoring
# (../../../2026-12-02/s17/next/long.py, 4 x 8192 tokens, bf16 and 4-bit) with main's prefill
# attention, then bi-bench end to end at batch 64 (3 repeats), mlx-lm's batch_generate beside
# it. About 8 minutes, the models written first (about a minute).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=$OUT/n2; mkdir -p $R
s=$SECONDS
python3 -c "from pathlib import Path; from bi_rl.bench.e2e import WORKLOADS, write_models; write_models(WORKLOADS['qwen3-1.7b'], Path('/tmp/q17'))" > $R/q17.log 2>&1
echo "models rc=$? [$((SECONDS-s)) s]" | tee $R/date.txt
s=$SECONDS
timeout 150 python3 docs/h200/2026-12-02/s17/next/long.py /tmp/q17 2>&1 | grep -v "compiling CUDA" > $R/long.txt
echo "long rc=$? [$((SECONDS-s)) s]" | tee -a $R/date.txt; cat $R/long.txt
s=$SECONDS
timeout 300 python3 -m bi_rl.cli.bench --only e2e -v --repeats 3 --model-dir /tmp/q17 --batches 64 \
  --json $R/e2e.json > $R/e2e.log 2>&1
echo "e2e rc=$? [$((SECONDS-s)) s]" | tee -a $R/date.txt; grep -v "first use" $R/e2e.log | tail -12
cd $OUT && tar czf n2.tgz n2
