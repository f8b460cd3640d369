#!/usr/bin/env bash
# Forty-fourth session's call 2 (the forty-third session's plan ../s43/next/call-s44.sh with
# tools/off_step_parts.py added after the concatenation A/B). Copy to the repository root;
# carry [".stage2"].
python3 -P -c "import mlx.core" 2>/dev/null || { bash .stage2/install > /tmp/install.log 2>&1; echo "install rc=$? [$SECONDS s]"; }
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
T=${T_ALL:-560}
o=$OUT/n; mkdir -p $o
date -u +%FT%TZ | tee $o/date.txt
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $o/device.txt
python3 -P -c "from bi_rl._source import source_digest; print(source_digest())" > $o/source.txt
git rev-parse HEAD > $o/commit.txt 2>/dev/null
M=/tmp/qwen3-1.7b-e2e
timeout 150 python3 -P tools/concat_ab.py --model-dir $M --models bf16,4-bit --batches 8,64 \
  --modes off --sets 1 --steps 64 --repeats 3 --json $o/concat-ab.json > $o/concat-ab.log 2>&1
echo "concat_ab rc=$? [$SECONDS s]"; grep "B=" $o/concat-ab.log | tail -4
for g in 1 0; do
  MLX_USE_CUDA_GRAPHS=$g timeout 80 python3 -P tools/off_step_parts.py --model-dir $M \
    --models bf16 --batches 1,8,64 --steps 48 --repeats 3 --json $o/osp-g$g.json > $o/osp-g$g.log 2>&1
  echo "off_step_parts graphs=$g rc=$? [$SECONDS s]"; grep "B=" $o/osp-g$g.log | tail -3
done
e2e() {  # name, concat value ('' = unset), batches, model[, MLX_USE_CUDA_GRAPHS]
  left=$(( T - SECONDS ))
  [ $left -gt 60 ] || { echo "$1 skipped: no time"; return; }
  MLX_USE_CUDA_GRAPHS=${5:-1} BI_RL_CONCAT_PROJECTIONS=$2 timeout $left python3 -P -m bi_rl.cli.bench --only e2e -v \
    --repeats 3 --model-dir $M --batches $3 --models $4 --json $o/$1.json > $o/$1.log 2>&1
  echo "$1 rc=$? [$SECONDS s]"; grep " B=" $o/$1.log | tail -1
}
e2e b8-plain "" 8 bf16
e2e b8-concat 1 8 bf16
e2e b64-plain "" 64 bf16
e2e b64-concat 1 64 bf16
e2e b8-nographs "" 8 bf16 0
e2e q4-b8-concat 1 8 4-bit
e2e b8-plain-2 "" 8 bf16
e2e b8-concat-2 1 8 bf16
tar czf $OUT/n.tgz -C $OUT n && rm -rf $o
