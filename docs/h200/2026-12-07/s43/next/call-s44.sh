#!/usr/bin/env bash
# Prepared in the forty-third session for the next one (never ran). That session's one
# machine (an H100) ran every step of ../../s42/next/call-s43.sh; what it left open:
# 1. Mode off at padded batches runs mlx-lm's kernels at mlx-lm's speed (median step off /
#    mlx-lm 7.80 / 7.98 ms at bf16 B = 8, 8.36 / 8.44 at B = 64), so off >= 1.1x mlx-lm
#    needs a cheaper step, not a cheaper engine. With every sibling set concatenated in both
#    modes (BI_RL_CONCAT_PROJECTIONS=1, another process of the same call) off's B = 8 step
#    read 6.69 ms (1.22x mlx-lm). One run each, so: first the bare step, plain against
#    concatenated in one process (tools/concat_ab.py, mode off, bf16 and 4-bit, B = 8 and 64;
#    smoke-tested on the CPU's tiny workload in 16 s), then end to end with the pair
#    alternated process by process at B = 8 and 64, bf16, and once at 4-bit B = 8.
# 2. On an H200 (if one comes) these rows are the first end-to-end figures there since the
#    fortieth session.
# Copy this to the repository root; carry [".stage2"].
python3 -P -c "import mlx.core" 2>/dev/null || { bash .stage2/install > /tmp/install.log 2>&1; echo "install rc=$? [$SECONDS s]"; }
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
T=${T_ALL:-540}
o=$OUT/n; mkdir -p $o
date -u +%FT%TZ | tee $o/date.txt
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $o/device.txt
python3 -P -c "from bi_rl._source import source_digest; print(source_digest())" > $o/source.txt
M=/tmp/qwen3-1.7b-e2e
# The model files are written by the first e2e run; concat_ab writes them too if absent.
timeout 150 python3 -P tools/concat_ab.py --model-dir $M --models bf16,4-bit --batches 8,64 \
  --modes off --sets 1 --steps 64 --repeats 3 --json $o/concat-ab.json > $o/concat-ab.log 2>&1
echo "concat_ab rc=$? [$SECONDS s]"; grep "B=" $o/concat-ab.log | tail -4
e2e() {  # name, concat value ('' = unset), batches, model
  left=$(( T - SECONDS ))
  [ $left -gt 60 ] || { echo "$1 skipped: no time"; return; }
  BI_RL_CONCAT_PROJECTIONS=$2 timeout $left python3 -P -m bi_rl.cli.bench --only e2e -v \
    --repeats 3 --model-dir $M --batches $3 --models $4 --json $o/$1.json > $o/$1.log 2>&1
  echo "$1 rc=$? [$SECONDS s]"; grep " B=" $o/$1.log | tail -1
}
e2e b8-plain "" 8 bf16
e2e b8-concat 1 8 bf16
e2e b8-plain-2 "" 8 bf16
e2e b8-concat-2 1 8 bf16
e2e b64-plain "" 64 bf16
e2e b64-concat 1 64 bf16
e2e q4-b8-concat 1 8 4-bit
tar czf $OUT/n.tgz -C $OUT n && rm -rf $o
