#!/usr/bin/env bash
# Why the 4-bit engine step reads 1.3-1.7x the bare step in bi-bench's end-to-end process and
# 1.00 in tools/engine_profile.py's own: the profile at 4-bit batch 8, as it is, after one
# mlx-lm batch_generate in the same process (--peer-first), and with Python's garbage
# collector off (--gc-off). Carry [".stage2"]; run from the repository root.
bash .stage2/install > /tmp/install.log 2>&1; echo "install rc=$? [$SECONDS s]"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
py="python3 -P"
o=$OUT/p; mkdir -p $o
date -u +%FT%TZ | tee $o/date.txt
for arm in plain peer gcoff; do
  case $arm in plain) extra="" ;; peer) extra="--peer-first" ;; gcoff) extra="--gc-off" ;; esac
  timeout $(( (580 - SECONDS) / 2 )) $py tools/engine_profile.py --model q4 --batch 8 --steps 96 \
    --repeats 3 --model-dir /tmp/qwen3-1.7b-e2e $extra --json $o/q4-b8-$arm.json > $o/q4-b8-$arm.log 2>&1
  echo "$arm rc=$? [$SECONDS s]"; grep -v compiling $o/q4-b8-$arm.log | head -4
done
tar czf $OUT/p.tgz -C $OUT p && rm -rf $o
