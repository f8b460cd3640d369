# Call 5: the engine's step head, each of this session's three changes alone and together
# (ab_engine.py: bare, old, held, shared, read, new), and a probe of whether reading an
# evaluated array waits for a step queued after it; then end to end at B = 1.
set -o pipefail
export PYTHONUNBUFFERED=1 BI_RL_CUDA_CACHE=/tmp/nvrtc-new MLX_PTX_CACHE_DIR=/tmp/mlx-new PYTHONPATH=$PWD
[ -d /tmp/mlx-new ] || { mkdir -p /tmp/mlx-new && cp -r .devrun/mlx-cache-e2e/. /tmp/mlx-new/; }
R=$OUT/n5; mkdir -p $R; date -u +%FT%TZ | tee $R/date.txt
python3 -c "from bi_rl._source import source_digest; print('source', source_digest())" | tee -a $R/date.txt
s=$SECONDS; [ -f /tmp/q17/bf16/config.json ] || python3 -c "from pathlib import Path; from bi_rl.bench.e2e import WORKLOADS, write_models; write_models(WORKLOADS['qwen3-1.7b'], Path('/tmp/q17'))" > $R/q17.log 2>&1; echo "== model [$((SECONDS-s)) s]" | tee -a $R/date.txt
s=$SECONDS; timeout 210 python3 .devrun/ab_engine.py /tmp/q17 bare,old,held,shared,read,new > $R/ab-engine.txt 2>&1; echo "== ab rc=$? [$((SECONDS-s)) s]" | tee -a $R/date.txt; grep -E "^B=|^read" $R/ab-engine.txt; tail -2 $R/ab-engine.txt | grep -vE "^B=|^read"
s=$SECONDS; timeout 160 python3 -m bi_rl.cli.bench --only e2e --model-dir /tmp/q17 --batches 1 --repeats 3 -v --json $R/e2e-b1.json > $R/e2e-b1.log 2>&1; echo "== e2e B=1 rc=$? [$((SECONDS-s)) s]" | tee -a $R/date.txt; grep -vE "compil|\[[0-9]+/" $R/e2e-b1.log | tail -3
gzip -f $R/*.log; tar czf $OUT/n5.tgz -C $OUT n5
