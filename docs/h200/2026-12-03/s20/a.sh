#!/usr/bin/env bash
# Call 2 (twentieth session, after staging: `bash .stage2/install > /tmp/install.log && bash
# docs/h200/2026-12-03/s20/a.sh`, carry .stage2 and .ab): the GPU tests of two arms side by
# side, while the Qwen3-1.7B-shaped models are written to /tmp/q17:
#   range: main with ../s19/next/row-range.patch, through every GPU test file that runs
#          attention (its kernels, windows, the H200 golden logs, engine, scorer);
#   qn:    main with the few-row quantized GEMM (kernels/cuda/hopper/qmm_narrow.cu), through
#          its own tests/test_cuda_hopper.py (every configuration against wgmma, bit for bit)
#          and the files that run quantized models (qmm, fusion, golden logs, engine, scorer).
# Each arm is a copy of bi_rl/ and kernels/ under .ab/ (qn also its tests/), imported with -P.
set -u
export PYTHONUNBUFFERED=1
R=$OUT/a; mkdir -p $R
pack() { (cd $OUT && tar czf a.tgz a); }
date -u +%FT%TZ | tee $R/date.txt
# the arms were copied without bi_rl/assets (the embedded default model: the call's carry limit)
for a in range qn; do ln -sfn $PWD/bi_rl/assets .ab/$a/bi_rl/assets; done
(PYTHONPATH=$PWD python3 -c "from pathlib import Path; from bi_rl.bench.e2e import WORKLOADS, write_models; write_models(WORKLOADS['qwen3-1.7b'], Path('/tmp/q17'))" > $R/q17.log 2>&1; echo "models rc=$?" >> $R/q17.log) &
s=$SECONDS
(PYTHONSAFEPATH=1 MLX_PTX_CACHE_DIR=/tmp/mlx-range PYTHONPATH=$PWD/.ab/range timeout 400 python3 -P -m pytest -q \
  -p no:cacheprovider -n 7 tests/test_cuda_attention.py tests/test_cuda_hopper_attention.py \
  tests/test_attention_window.py tests/test_rollouts_golden.py tests/test_engine.py \
  tests/test_scorer.py > $R/tests-range.log 2>&1; echo "tests range rc=$? [$((SECONDS-s)) s]" >> $R/date.txt) &
T=.ab/qn/tests
# the tests find the golden logs, tools and examples from their own parent directory
for d in rollouts tools examples pyproject.toml; do ln -sfn $PWD/$d .ab/qn/$d; done
PYTHONSAFEPATH=1 MLX_PTX_CACHE_DIR=/tmp/mlx-qn PYTHONPATH=$PWD/.ab/qn timeout 400 python3 -P -m pytest -q \
  -p no:cacheprovider -n 7 $T/test_cuda_hopper.py $T/test_cuda_qmm.py $T/test_fusion.py \
  $T/test_rollouts_golden.py $T/test_engine.py $T/test_scorer.py > $R/tests-qn.log 2>&1
echo "tests qn rc=$? [$((SECONDS-s)) s]" >> $R/date.txt
wait
cat $R/date.txt
for a in range qn; do tail -1 $R/tests-$a.log; grep -E "^(FAILED|ERROR)" $R/tests-$a.log | head -8; done
tail -1 $R/q17.log
pack
