# The scorer's output head on the read rows alone: its tests and the H200 golden logs on the
# GPU (rescoring's bits must not move), then the rescoring A/B (ab_head.py) on the 1.7B shape.
set -o pipefail
export PYTHONUNBUFFERED=1 BI_RL_CUDA_CACHE=/tmp/nvrtc-new MLX_PTX_CACHE_DIR=/tmp/mlx-new PYTHONPATH=$PWD
mkdir -p /tmp/nvrtc-new /tmp/mlx-new
R=$OUT/h1; mkdir -p $R; date -u +%FT%TZ | tee $R/date.txt; cat .devrun/HEAD >> $R/date.txt
(python3 -c "from pathlib import Path; from bi_rl.bench.e2e import WORKLOADS, write_models; write_models(WORKLOADS['qwen3-1.7b'], Path('/tmp/q17'))" > $R/q17.log 2>&1; echo "== q17 rc=$?" >> $R/date.txt) &
s=$SECONDS; timeout 200 python3 -m pytest -q -n 8 -p xdist tests/test_scorer.py tests/test_rollouts_golden.py tests/test_cli_rescore.py > $R/tests.log 2>&1; echo "== tests rc=$? [$((SECONDS-s)) s]" | tee -a $R/date.txt; tail -3 $R/tests.log
wait
s=$SECONDS; timeout 260 python3 .devrun/ab_head.py /tmp/q17/bf16 2>&1 | tee $R/ab-head.txt; echo "== ab rc=$? [$((SECONDS-s)) s]" | tee -a $R/date.txt
gzip -f $R/*.log
