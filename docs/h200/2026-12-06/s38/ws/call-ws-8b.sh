#!/usr/bin/env bash
# Call 3 of the thirty-eighth session (01:17 UTC, same warm machine, same tree): the Llama-3-8B
# shapes at 1 and 16 rows, chained, auto against the warp-specialised blocks.
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1; o=$OUT/w2; mkdir -p $o
date -u +%FT%TZ | tee $o/date.txt
timeout 95 python3 -P tools/hopper_ab.py --bits 4 --chain --ms 1,16 --rounds 5 \
  --configs auto,ws1x2x16x4 --only 4096,4096 --only 14336,4096 --only 4096,14336 \
  > $o/ab-q4-ws-chain-8b.jsonl 2> $o/ab-q4-ws-chain-8b.err
echo "ab rc=$? [$SECONDS s]"; cut -c1-330 $o/ab-q4-ws-chain-8b.jsonl; tail -2 $o/ab-q4-ws-chain-8b.err
