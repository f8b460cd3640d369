#!/usr/bin/env bash
# Second round of the attention table (512 first this time), on the warm machine of run s.
bash .stage2/install > /tmp/i.log 2>&1; export PYTHONPATH=$PWD PYTHONUNBUFFERED=1; mkdir -p $OUT/r2
for k in 512 256; do BI_RL_ATTN_SPLIT=$k timeout 95 python3 -P -m bi_rl.cli.bench --only attention \
  --json $OUT/r2/attn-$k-2.json > $OUT/r2/attn-$k-2.log 2>&1; echo "$k rc=$?"; done
tar czf $OUT/r2.tgz -C $OUT r2 && rm -rf $OUT/r2
