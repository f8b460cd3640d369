#!/usr/bin/env bash
# Prepared in the thirty-sixth session, not run (its device time was spent): bi-bench's
# half-type GEMM and 4-bit tables with the decode-sized products (M <= 64) also timed as
# chains (bi_rl.bench.kernels.Chain), so that a kernel that leaves multiprocessors idle cannot
# borrow the overlap of independent calls; then the 17-64-row block width as chains
# (tools/hopper_ab.py --chain): DECODE's 128 columns (auto) against 64 and 32, which make two
# and four times the blocks on the 2048-column projections. Copy to the repository root and
# carry [".stage2"].
python3 -P -c "import mlx.core" 2>/dev/null || { bash .stage2/install > /tmp/install.log 2>&1; echo "install rc=$? [$SECONDS s]"; }
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
o=$OUT/c; mkdir -p $o
date -u +%FT%TZ | tee $o/date.txt
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $o/device.txt
for part in gemm qmm; do
  timeout $(( (380 - SECONDS) / ${left:-2} )) python3 -P -m bi_rl.cli.bench --only $part -v \
    --json $o/$part.json > $o/$part.log 2>&1
  echo "$part rc=$? [$SECONDS s]"; sed -n '/as a chain/,$p' $o/$part.log | tail -28; left=1
done
timeout $((570 - SECONDS)) python3 -P tools/hopper_ab.py --chain --configs auto,64x1x8,32x1x8 \
  --ms 17,32,64 > $o/ab-chain.jsonl 2> $o/ab-chain.err
echo "hopper_ab rc=$? [$SECONDS s]"; cut -c1-200 $o/ab-chain.jsonl
tar czf $OUT/c.tgz -C $OUT c && rm -rf $o
