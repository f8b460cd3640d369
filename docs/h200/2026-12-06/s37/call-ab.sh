#!/usr/bin/env bash
# Chained A/B of block shapes: past 64 rows at 128-2048 rows (rescoring and prefill of short
# sequences, where PREFILL's 128 x 256 blocks make fewer blocks than multiprocessors), and
# 16 vs 32 columns at 17-64 rows on the narrow outputs.
python3 -P -c "import mlx.core" 2>/dev/null || { bash .stage2/install > /tmp/install.log 2>&1; echo "install rc=$? [$SECONDS s]"; }
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
o=$OUT/ab; mkdir -p $o
date -u +%FT%TZ | tee $o/date.txt
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $o/device.txt
timeout 400 python3 -P tools/hopper_ab.py --chain --configs auto,128x2x4d,128x1x8,64x2x6d \
  --ms 128,256,512,1024,2048 > $o/ab-prefill-chain.jsonl 2> $o/ab-prefill-chain.err
echo "prefill rc=$? [$SECONDS s]"
for s in 2048,2048 6144,2048 2048,4096 2048,6144; do
  timeout $((560 - SECONDS)) python3 -P tools/hopper_ab.py --chain --configs auto,32x1x8,16x1x8 \
    --ms 17,64 --only $s >> $o/ab-decode-chain.jsonl 2>> $o/ab-decode-chain.err
  echo "decode $s rc=$? [$SECONDS s]"
done
python3 - $o <<'P'
import json, sys
for f in ("ab-prefill-chain.jsonl", "ab-decode-chain.jsonl"):
    for l in open(f"{sys.argv[1]}/{f}"):
        d = json.loads(l)
        print(d["cell"], d.get("same_bits"), {k: v for k, v in d.items() if k.endswith("_ms")})
P
tar czf $OUT/ab.tgz -C $OUT ab && rm -rf $o
