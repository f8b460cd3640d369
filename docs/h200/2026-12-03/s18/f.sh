#!/usr/bin/env bash
# Run f (eighteenth session, a fresh machine after staging: `bash .stage2/install > /tmp/install.log
# && bash docs/h200/2026-12-03/s18/f.sh`, carry .stage2 and .ab): arm new (the wgmma prefill
# attention with the pass search by warp reductions, the fold buffer in 16-byte groups with a
# vector path where both rows fold into held values, K/V pointers advanced a block a load, Q
# read 16 bytes at a time) through the attention GPU tests; then the short ncu metrics of one
# launch of each arm's prefill attention at 8192 causal tokens, head dim 128 (new, main), and
# bi-bench --only attention new, then main.
set -u
export PYTHONUNBUFFERED=1
R=$OUT/f; mkdir -p $R
# the results so far into one archive after each stage, so that a call cut at its limit still
# brings them back
pack() { (cd $OUT && tar czf f.tgz f); }
date -u +%FT%TZ | tee $R/date.txt
arm() { echo $PWD/.ab/$1; }
for a in main new; do
  (cd $(arm $a) && find bi_rl kernels -type f \( -name '*.py' -o -name '*.cu' -o -name '*.cuh' \) -print0 \
    | sort -z | xargs -0 sha256sum | sha256sum) | sed "s/^/$a /" >> $R/tree.txt
done
s=$SECONDS
PYTHONSAFEPATH=1 MLX_PTX_CACHE_DIR=/tmp/mlx-new PYTHONPATH=$(arm new) timeout 240 python3 -P -m pytest -q -p no:cacheprovider -n 15 \
  tests/test_cuda_hopper_attention.py tests/test_cuda_attention.py > $R/tests.log 2>&1
echo "tests rc=$? [$((SECONDS-s)) s]" | tee -a $R/date.txt
tail -1 $R/tests.log; grep -E "^(FAILED|ERROR)" $R/tests.log | head -5
pack
for a in new main; do
  s=$SECONDS
  MLX_PTX_CACHE_DIR=/tmp/mlx-$a PYTHONPATH=$(arm $a) timeout 60 ncu --profile-from-start off --clock-control none --metrics gpu__time_duration.sum,smsp__inst_executed.sum,sm__inst_executed.avg.per_cycle_active -k regex:bi_hattn python3 -P tools/attn_profile.py --case prefill > $R/ncu-$a.txt 2>&1
  echo "ncu $a rc=$? [$((SECONDS-s)) s]"; grep -E "duration|inst_executed" $R/ncu-$a.txt | head -4
done
pack
for a in new main; do
  s=$SECONDS
  MLX_PTX_CACHE_DIR=/tmp/mlx-$a PYTHONPATH=$(arm $a) python3 -P -c "import bi_rl; print(bi_rl.__file__)" > $R/attn-$a.log
  MLX_PTX_CACHE_DIR=/tmp/mlx-$a PYTHONPATH=$(arm $a) timeout 90 python3 -P -m bi_rl.cli.bench --only attention -v --json $R/attn-$a.json >> $R/attn-$a.log 2>&1
  echo "bench $a rc=$? [$((SECONDS-s)) s]" | tee -a $R/date.txt
  grep -E "^attention prefill" $R/attn-$a.log | head -8
  pack
done
pack && rm -rf $R
