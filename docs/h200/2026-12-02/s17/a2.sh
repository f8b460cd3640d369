#!/usr/bin/env bash
# Run a2 (a fresh machine after staging, right after run a): run a again for arm v after its
# compile fix (the step's split flag a plain bool instead of a generic lambda's type, which the
# device's NVRTC refused), then arm main's bench once more. Otherwise as a.sh. The call was
# `bash .stage2/install > /tmp/install.log && bash docs/h200/2026-12-02/s17/a2.sh`.
export PYTHONUNBUFFERED=1
R=$OUT/a2; mkdir -p $R
date -u +%FT%TZ | tee $R/date.txt
arm() { echo $PWD/.ab/$1; }
for a in v; do
  (cd $(arm $a) && find bi_rl kernels -type f \( -name '*.py' -o -name '*.cu' -o -name '*.cuh' \) -print0 \
    | sort -z | xargs -0 sha256sum | sha256sum) | sed "s/^/$a /" >> $R/tree.txt
done
s=$SECONDS
PYTHONSAFEPATH=1 MLX_PTX_CACHE_DIR=/tmp/mlx-v PYTHONPATH=$(arm v) timeout 230 python3 -P -m pytest -q -p no:cacheprovider -n 10 \
  tests/test_cuda_hopper_attention.py tests/test_cuda_attention.py > $R/tests.log 2>&1
echo "tests rc=$? [$((SECONDS-s)) s]" >> $R/date.txt
wait
for a in v main; do
  s=$SECONDS
  n=$(ls $R/attn-$a-*.json 2>/dev/null | wc -l)
  MLX_PTX_CACHE_DIR=/tmp/mlx-$a PYTHONPATH=$(arm $a) python3 -P -c "import bi_rl; print(bi_rl.__file__)" > $R/attn-$a-$n.log
  MLX_PTX_CACHE_DIR=/tmp/mlx-$a PYTHONPATH=$(arm $a) timeout 100 python3 -P -m bi_rl.cli.bench --only attention -v --json $R/attn-$a-$n.json >> $R/attn-$a-$n.log 2>&1
  echo "bench $a-$n rc=$? [$((SECONDS-s)) s]" >> $R/date.txt
done
cat $R/date.txt
tail -1 $R/tests.log; grep -E "^(FAILED|ERROR)" $R/tests.log | head -5
for a in v; do
  s=$SECONDS
  MLX_PTX_CACHE_DIR=/tmp/mlx-$a PYTHONPATH=$(arm $a) timeout 60 ncu --profile-from-start off --clock-control none --metrics gpu__time_duration.sum,smsp__inst_executed.sum,sm__warps_active.avg.pct_of_peak_sustained_active,sm__inst_executed.avg.per_cycle_active -k regex:bi_hattn python3 -P tools/attn_profile.py --case prefill > $R/ncu-$a.txt 2>&1
  echo "ncu $a rc=$? [$((SECONDS-s)) s]"; grep -E "bi_hattn|duration|inst_executed" $R/ncu-$a.txt | head -8
done
wait; tail -1 $R/q17.log
