#!/usr/bin/env bash
# Prepared in the forty-fourth session for the next one (never ran). That session made mode
# off concatenate every sibling set on Hopper for rollouts of more than one row a step
# (bi_rl.concat.chosen_sets(invariant, rows)), from one-process bare A/Bs (B = 8 0.91-0.94,
# B = 64 0.94-1.02) on a host whose end-to-end rows spread up to 0.51. What it left open:
# 1. The GPU tests of the files the change touches (test_concat, test_engine, test_bench).
# 2. End to end with the new default itself, 3 repeats, bf16 B = 1 / 8 / 64 and 4-bit B = 8
#    (off / mlx-lm is the figure; B = 1 must not move: no concatenation there), and
#    the 4-bit bare A/B the forty-fourth session's 150 s limit cut.
# Copy this to the repository root; carry [".stage2"].
python3 -P -c "import mlx.core" 2>/dev/null || { bash .stage2/install > /tmp/install.log 2>&1; echo "install rc=$? [$SECONDS s]"; }
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
T=${T_ALL:-540}
o=$OUT/n; mkdir -p $o
date -u +%FT%TZ | tee $o/date.txt
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $o/device.txt
python3 -P -c "from bi_rl._source import source_digest; print(source_digest())" > $o/source.txt
M=/tmp/qwen3-1.7b-e2e
xd=""; python3 -P -c "import xdist" 2>/dev/null && xd="-p xdist -n 8"
timeout ${T_TESTS:-100} python3 -P -m pytest -q -p no:cacheprovider $xd tests/test_concat.py \
  tests/test_engine.py tests/test_bench.py > $o/tests.log 2>&1
echo "tests rc=$? [$SECONDS s]"; tail -2 $o/tests.log
e2e() {  # name, batches, model
  left=$(( T - SECONDS ))
  [ $left -gt 60 ] || { echo "$1 skipped: no time"; return; }
  timeout $left python3 -P -m bi_rl.cli.bench --only e2e -v --repeats 3 --model-dir $M \
    --batches $2 --models $3 --json $o/$1.json > $o/$1.log 2>&1
  echo "$1 rc=$? [$SECONDS s]"; grep " B=" $o/$1.log | tail -2
}
e2e b8 8 bf16
e2e b64 64 bf16
# 3. Rescoring's split between the host and the device, per mode (tools/score_parts.py): one
#    sequence at batch 1 (bi-bench's B = 1 rescoring row), eight at batch 1 (pipelined) and
#    eight at batch 8. If strict's host never waits, its gap to off is host time.
for spec in "1 1" "1 8" "8 8"; do
  set -- $spec; left=$(( T - SECONDS ))
  [ $left -gt 50 ] && timeout $left python3 -P tools/score_parts.py --model-dir $M --models bf16 \
    --batches $1 --items $2 --repeats 5 --fill --json $o/score-parts-b$1-i$2.json \
    > $o/score-parts-b$1-i$2.log 2>&1; grep "B=" $o/score-parts-b$1-i$2.log 2>/dev/null | tail -1
done
e2e q4-b8 8 4-bit
e2e b1 1 bf16
left=$(( T - SECONDS ))
[ $left -gt 70 ] && timeout $left python3 -P tools/concat_ab.py --model-dir $M --models 4-bit \
  --batches 8 --modes off --sets 1 --steps 64 --repeats 3 --json $o/concat-ab-q4.json \
  > $o/concat-ab-q4.log 2>&1; grep "B=" $o/concat-ab-q4.log 2>/dev/null | tail -1
# 4. Rescoring at B = 8 (about 2,400 rows a forward) and B = 1 (about 300): 128 x 256 blocks
#    over a 2048-column output make 152 blocks at 2,400 rows (1.15 waves of 132) and 24 at
#    300; timed as a model chains them, the dispatcher's pick against the narrower shapes.
left=$(( T - SECONDS ))
[ $left -gt 70 ] && timeout $left python3 -P tools/hopper_ab.py --chain --ms 300,2400 \
  --configs auto,MIDDLE,DECODE --only 2048,2048 --only 6144,2048 --only 2048,6144 \
  --rounds 7 > $o/hopper-ab-rescore.jsonl 2> $o/hopper-ab-rescore.log
tar czf $OUT/n.tgz -C $OUT n && rm -rf $o
