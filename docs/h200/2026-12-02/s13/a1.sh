# Attention A/B, part 1. Arms (each a full copy of the package, imported with python3 -P so
# the repository root's copy cannot shadow it; each prints the file it imported):
#   main  this tree
#   pk    main + the attn-pk patch (a block's P carried packed, 16 registers)
#   lb    pk + __launch_bounds__(128, 3) on the head-dim-64 one-warpgroup kernel (168
#         registers at most: three blocks a multiprocessor)
# The attention GPU tests (bit for bit against the mma.sync kernel) on pk and lb side by
# side, then bi-bench --only attention in the order main, pk, lb (a2.sh: lb, pk, main), each
# in its own process, alone on the GPU. The 1.7B-shaped models are written meanwhile.
export PYTHONUNBUFFERED=1 BI_RL_CUDA_CACHE=/tmp/nvrtc
R=$OUT/a1; mkdir -p $R /tmp/nvrtc; git log -1 --format=%h > $R/tree.txt 2>/dev/null
date -u +%FT%TZ | tee $R/date.txt
(PYTHONPATH=$PWD python3 -c "from pathlib import Path; from bi_rl.bench.e2e import WORKLOADS, write_models; write_models(WORKLOADS['qwen3-1.7b'], Path('/tmp/q17'))" > $R/q17.log 2>&1; echo done >> $R/q17.log) &
arm() { case $1 in main) echo $PWD ;; *) echo $PWD/.ab/$1 ;; esac; }
for a in pk lb; do
  (s=$SECONDS; MLX_PTX_CACHE_DIR=/tmp/mlx-$a PYTHONPATH=$(arm $a) timeout 200 python3 -P -m pytest -q -p no:cacheprovider tests/test_cuda_hopper_attention.py > $R/tests-$a.log 2>&1; echo "tests $a rc=$? [$((SECONDS-s)) s]" >> $R/date.txt) &
done
wait
for a in ${ARMS:-main pk lb}; do
  s=$SECONDS
  MLX_PTX_CACHE_DIR=/tmp/mlx-$a PYTHONPATH=$(arm $a) python3 -P -c "import bi_rl; print(bi_rl.__file__)" > $R/attn-$a.log
  MLX_PTX_CACHE_DIR=/tmp/mlx-$a PYTHONPATH=$(arm $a) timeout 150 python3 -P -m bi_rl.cli.bench --only attention -v --json $R/attn-$a.json >> $R/attn-$a.log 2>&1
  echo "bench $a rc=$? [$((SECONDS-s)) s]" >> $R/date.txt
done
cat $R/date.txt; for a in pk lb; do tail -1 $R/tests-$a.log; grep -E "^(FAILED|ERROR)" $R/tests-$a.log | head -5; done
