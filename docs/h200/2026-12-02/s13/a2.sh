# Attention A/B, part 2 (same machine, after a1.sh). Arms (each a full copy of the package, imported with python3 -P so
# the repository root's copy cannot shadow it; each prints the file it imported):
#   main  this tree
#   pk    main + the attn-pk patch (a block's P carried packed, 16 registers)
#   lb    pk + __launch_bounds__(128, 3) on the head-dim-64 one-warpgroup kernel (168
#         registers at most: three blocks a multiprocessor)
# bi-bench --only attention in the order lb, pk, main (a1.sh ran main, pk, lb), each in its
# own process, alone on the GPU. Then whether MLX's stock gradient repeats bit for bit on the
# GPU (grad_repro.py) and tests/test_policy.py on the GPU with its two fixes.
export PYTHONUNBUFFERED=1 BI_RL_CUDA_CACHE=/tmp/nvrtc
R=$OUT/a2; mkdir -p $R /tmp/nvrtc; git log -1 --format=%h > $R/tree.txt 2>/dev/null
date -u +%FT%TZ | tee $R/date.txt
arm() { case $1 in main) echo $PWD ;; *) echo $PWD/.ab/$1 ;; esac; }
for a in ${ARMS:-lb pk main}; do
  s=$SECONDS
  MLX_PTX_CACHE_DIR=/tmp/mlx-$a PYTHONPATH=$(arm $a) python3 -P -c "import bi_rl; print(bi_rl.__file__)" > $R/attn-$a.log
  MLX_PTX_CACHE_DIR=/tmp/mlx-$a PYTHONPATH=$(arm $a) timeout 150 python3 -P -m bi_rl.cli.bench --only attention -v --json $R/attn-$a.json >> $R/attn-$a.log 2>&1
  echo "bench $a rc=$? [$((SECONDS-s)) s]" >> $R/date.txt
done
MLX_PTX_CACHE_DIR=/tmp/mlx-main PYTHONPATH=$PWD timeout 60 python3 docs/h200/2026-12-02/s13/grad_repro.py > $R/grad-repro.txt 2>&1
MLX_PTX_CACHE_DIR=/tmp/mlx-main PYTHONPATH=$PWD timeout 120 python3 -m pytest -q -p no:cacheprovider tests/test_policy.py > $R/policy.log 2>&1; echo "test_policy rc=$?" >> $R/date.txt
cat $R/date.txt; grep -c differ $R/grad-repro.txt; grep differ $R/grad-repro.txt | head; tail -1 $R/policy.log
