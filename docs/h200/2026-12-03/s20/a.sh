#!/usr/bin/env bash
# Call 2 (twentieth session, after staging: `bash .stage2/install > /tmp/install.log && bash
# docs/h200/2026-12-03/s20/a.sh`, carry .stage2 and .ab): the nineteenth session's
# next/run.sh (arm range = main with row-range.patch through every GPU test file that runs
# attention, then bi-bench --only attention range, main, range; results under $OUT/g), while
# the Qwen3-1.7B-shaped models for the end-to-end call are written to /tmp/q17.
set -u
mkdir -p $OUT/g
(PYTHONPATH=$PWD python3 -c "from pathlib import Path; from bi_rl.bench.e2e import WORKLOADS, write_models; write_models(WORKLOADS['qwen3-1.7b'], Path('/tmp/q17'))" > $OUT/g/q17.log 2>&1; echo "models rc=$?" >> $OUT/g/q17.log) &
bash docs/h200/2026-12-03/s19/next/run.sh
wait
tail -1 $OUT/g/q17.log
(cd $OUT && tar czf g.tgz g)
