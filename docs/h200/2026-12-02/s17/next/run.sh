#!/usr/bin/env bash
# For the next device session (after staging: call 2 `bash .stage2/install && bash
# docs/h200/2026-12-02/s17/next/run.sh`): main's long-context rescoring (long.py, 4 x 8192
# tokens, bf16 and 4-bit: the attention issue's end-to-end figure with the seventeenth
# session's prefill attention), then bi-bench end to end at batch 1 and 8 with 5 repeats,
# mlx-lm's batch_generate beside it. About 8 minutes with the models' kernels compiled on
# first use.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=$OUT/n; mkdir -p $R
date -u +%FT%TZ | tee $R/date.txt
git log -1 --format=%h >> $R/date.txt 2>/dev/null
s=$SECONDS
python3 -c "from pathlib import Path; from bi_rl.bench.e2e import WORKLOADS, write_models; write_models(WORKLOADS['qwen3-1.7b'], Path('/tmp/q17'))" > $R/q17.log 2>&1
echo "models rc=$? [$((SECONDS-s)) s]" | tee -a $R/date.txt
s=$SECONDS
timeout 200 python3 docs/h200/2026-12-02/s17/next/long.py /tmp/q17 2>&1 | grep -v "compiling CUDA" > $R/long.txt
echo "long rc=$? [$((SECONDS-s)) s]" | tee -a $R/date.txt; cat $R/long.txt
s=$SECONDS
timeout 330 python3 -m bi_rl.cli.bench --only e2e -v --repeats 5 --model-dir /tmp/q17 --batches 1,8 \
  --json $R/e2e.json > $R/e2e.log 2>&1
echo "e2e rc=$? [$((SECONDS-s)) s]" | tee -a $R/date.txt; tail -14 $R/e2e.log
