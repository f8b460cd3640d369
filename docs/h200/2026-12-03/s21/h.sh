#!/usr/bin/env bash
# For the next device session, call 2 after arms.sh here and staging (`bash .stage2/install >
# /tmp/install.log && bash docs/h200/2026-12-03/s20/next/run.sh`, carry .stage2 and .ab): arm
# ahead through the attention GPU tests (its own tests/, with the read-ahead edge test), then
# bi-bench --only attention ahead, main, ahead (decode at B = 1 over 32768 / 131072 keys is
# what it should move: the combine's one round trip a split), then Nsight Compute's duration
# of one combine launch at B = 1 over 131072 keys on both arms, with the L2 left warm
# (--cache-control none), as a decode step finds it; last, splits.py on both arms (1, 4 and 16
# splits a block forced at B = 1 and 2 over 32768 / 131072 keys). About 7 minutes.
set -u
export PYTHONUNBUFFERED=1
R=$OUT/h; mkdir -p $R
pack() { (cd $OUT && tar czf h.tgz h); }
arm() { case $1 in main*) echo $PWD ;; *) echo $PWD/.ab/${1%2} ;; esac; }
date -u +%FT%TZ | tee $R/date.txt
ln -sfn $PWD/bi_rl/assets .ab/ahead/bi_rl/assets
for d in rollouts tools examples pyproject.toml; do ln -sfn $PWD/$d .ab/ahead/$d; done
s=$SECONDS
PYTHONSAFEPATH=1 MLX_PTX_CACHE_DIR=/tmp/mlx-ahead PYTHONPATH=$(arm ahead) timeout 300 python3 -P -m pytest -q \
  -p no:cacheprovider -n 14 .ab/ahead/tests/test_cuda_attention.py .ab/ahead/tests/test_attention_window.py \
  > $R/tests-ahead.log 2>&1
echo "tests ahead rc=$? [$((SECONDS-s)) s]" | tee -a $R/date.txt
tail -1 $R/tests-ahead.log; grep -E "^(FAILED|ERROR)" $R/tests-ahead.log | head -8
pack
for a in ahead main ahead2; do
  s=$SECONDS
  c=/tmp/mlx-${a%2}
  MLX_PTX_CACHE_DIR=$c PYTHONPATH=$(arm $a) timeout 110 python3 -P -m bi_rl.cli.bench --only attention -v \
    --json $R/attn-$a.json > $R/attn-$a.log 2>&1
  echo "bench $a rc=$? [$((SECONDS-s)) s]" | tee -a $R/date.txt
  grep -E "^attention decode bf16 16/8 D=128 B=(1|8) keys=(32768|131072)" $R/attn-$a.log
  pack
done
for a in ahead main; do
  MLX_PTX_CACHE_DIR=/tmp/mlx-$a PYTHONPATH=$(arm $a) timeout 60 ncu --profile-from-start off \
    --cache-control none --clock-control none --metrics gpu__time_duration.sum -k regex:bi_attn \
    python3 -P $PWD/tools/attn_profile.py --case decode1 > $R/ncu-$a.txt 2>&1
  echo "ncu $a rc=$?"; grep -E "bi_attn|duration" $R/ncu-$a.txt | head -8
done
pack
for a in ahead main; do
  MLX_PTX_CACHE_DIR=/tmp/mlx-$a PYTHONPATH=$(arm $a) timeout 90 python3 -P \
    docs/h200/2026-12-03/s20/next/splits.py > $R/splits-$a.txt 2>&1
  echo "splits $a rc=$?"; cat $R/splits-$a.txt
done
pack
