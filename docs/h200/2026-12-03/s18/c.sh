#!/usr/bin/env bash
# Run c (eighteenth session, right after run b on the same machine): s17/next/run.sh without its
# model writing (run b wrote /tmp/q17): long-context rescoring (long.py, 4 x 8192 tokens, bf16
# and 4-bit) on main, then bi-bench end to end at batch 1 and 8 with 5 repeats.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=$OUT/c; mkdir -p $R
date -u +%FT%TZ | tee $R/date.txt
[ -d /tmp/q17/q4 ] || { echo "no models"; exit 3; }
s=$SECONDS
timeout 200 python3 docs/h200/2026-12-02/s17/next/long.py /tmp/q17 2>&1 | grep -v "compiling CUDA" > $R/long.txt
echo "long rc=$? [$((SECONDS-s)) s]" | tee -a $R/date.txt; cat $R/long.txt
s=$SECONDS
timeout 330 python3 -m bi_rl.cli.bench --only e2e -v --repeats 5 --model-dir /tmp/q17 --batches 1,8 \
  --json $R/e2e.json > $R/e2e.log 2>&1
echo "e2e rc=$? [$((SECONDS-s)) s]" | tee -a $R/date.txt; grep -v "first use" $R/e2e.log | tail -16
