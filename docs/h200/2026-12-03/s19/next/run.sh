#!/usr/bin/env bash
# For the next device session, call 2 after arms.sh here and staging (`bash .stage2/install >
# /tmp/install.log && bash docs/h200/2026-12-03/s19/next/run.sh`, carry .stage2 and .ab):
# arm range through every GPU test file that runs attention (its kernels, windows, the H200
# golden logs, engine, scorer), then bi-bench --only attention on range, main, range (the
# left-padded bool-mask prefill case is the one the patch should move: 2.93 ms in the
# nineteenth session; the left-padded decode case, added after that session's runs, the
# engine's decode batch; the causal cases are guards that it moved nothing else). About 8-9
# minutes on a machine that has compiled nothing.
set -u
export PYTHONUNBUFFERED=1
R=$OUT/g; mkdir -p $R
pack() { (cd $OUT && tar czf g.tgz g); }
arm() { case $1 in main*) echo $PWD ;; *) echo $PWD/.ab/${1%2} ;; esac; }
date -u +%FT%TZ | tee $R/date.txt
s=$SECONDS
PYTHONSAFEPATH=1 MLX_PTX_CACHE_DIR=/tmp/mlx-range PYTHONPATH=$(arm range) timeout 330 python3 -P -m pytest -q \
  -p no:cacheprovider -n 14 tests/test_cuda_attention.py tests/test_cuda_hopper_attention.py \
  tests/test_attention_window.py tests/test_rollouts_golden.py tests/test_engine.py \
  tests/test_scorer.py > $R/tests-range.log 2>&1
echo "tests range rc=$? [$((SECONDS-s)) s]" | tee -a $R/date.txt
tail -1 $R/tests-range.log; grep -E "^(FAILED|ERROR)" $R/tests-range.log | head -8
pack
for a in range main range2; do
  s=$SECONDS
  c=/tmp/mlx-${a%2}
  MLX_PTX_CACHE_DIR=$c PYTHONPATH=$(arm $a) python3 -P -c "import bi_rl; print(bi_rl.__file__)" > $R/attn-$a.log
  MLX_PTX_CACHE_DIR=$c PYTHONPATH=$(arm $a) timeout 110 python3 -P -m bi_rl.cli.bench --only attention -v --json $R/attn-$a.json >> $R/attn-$a.log 2>&1
  echo "bench $a rc=$? [$((SECONDS-s)) s]" | tee -a $R/date.txt
  grep -E "^attention (prefill|decode bf16 left-padded|decode bf16 16/8 D=128 B=1 )" $R/attn-$a.log | head -12
  pack
done
