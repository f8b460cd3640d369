# Next session, call 5: main's host phases of the bare decode step at B = 1 and 8, off and
# strict (host_phases.py; the eighth session's run 4 had strict building its graph in
# 4.0-4.3 ms against stock's 1.8-2.0), then end to end at B = 8 and 1, 3 repeats.
set -o pipefail
export PYTHONUNBUFFERED=1 BI_RL_CUDA_CACHE=/tmp/nvrtc-cache MLX_PTX_CACHE_DIR=/tmp/mlx-ptx PYTHONPATH=$PWD
bash .devrun/caches.sh main
R=$OUT/n3; mkdir -p $R; date -u +%FT%TZ | tee $R/date.txt
[ -f /tmp/q17/bf16/config.json ] || python3 -c "from pathlib import Path; from bi_rl.bench.e2e import WORKLOADS, write_models; write_models(WORKLOADS['qwen3-1.7b'], Path('/tmp/q17'))"
s=$SECONDS; timeout 150 python3 .devrun/host_phases.py /tmp/q17 > $R/host-phases.txt 2>&1; echo "== host phases rc=$? [$((SECONDS-s)) s]" | tee -a $R/date.txt; grep "^B=" $R/host-phases.txt
s=$SECONDS; timeout 200 python3 -m bi_rl.cli.bench --only e2e --model-dir /tmp/q17 --batches 8 --repeats 3 -v --json $R/e2e-b8.json > $R/e2e-b8.log 2>&1; echo "== e2e B=8 rc=$? [$((SECONDS-s)) s]" | tee -a $R/date.txt; grep -vE "compil|\[[0-9]+/" $R/e2e-b8.log | tail -4
s=$SECONDS; timeout 200 python3 -m bi_rl.cli.bench --only e2e --model-dir /tmp/q17 --batches 1 --repeats 3 -v --json $R/e2e-b1.json > $R/e2e-b1.log 2>&1; echo "== e2e B=1 rc=$? [$((SECONDS-s)) s]" | tee -a $R/date.txt; grep -vE "compil|\[[0-9]+/" $R/e2e-b1.log | tail -4
gzip -f $R/*.log; tar czf $OUT/n3.tgz -C $OUT n3
