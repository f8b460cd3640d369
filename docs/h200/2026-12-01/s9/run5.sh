# Main with narrow-pipe merged and the small-grid split rule (attention.choose_config; Python
# only, so the carried caches still match): the attention GPU tests, then bi-bench's attention
# cells (the 16 decode cells incl. B = 1 over 32768 / 131072 keys) and the spb sweep again
# with the new dispatcher's picks.
set -o pipefail
export PYTHONUNBUFFERED=1 BI_RL_CUDA_CACHE=/tmp/nvrtc-cache MLX_PTX_CACHE_DIR=/tmp/mlx-ptx
bash .devrun/caches.sh
R=$OUT/p5; mkdir -p $R; date -u +%FT%TZ | tee $R/date.txt
python3 -c "from bi_rl._source import source_digest; print('source', source_digest())" | tee -a $R/date.txt
s=$SECONDS; timeout 240 python3 -m pytest -q -n 4 -p xdist tests/test_cuda_attention.py tests/test_cuda_attention_build.py tests/test_cuda_hopper_attention.py > $R/tests.log 2>&1; echo "== attention tests rc=$? [$((SECONDS-s)) s]" | tee -a $R/date.txt; tail -2 $R/tests.log
s=$SECONDS; timeout 120 python3 -m bi_rl.cli.bench --only attention --json $R/attn.json > $R/attn.log 2>&1; echo "== bench rc=$? [$((SECONDS-s)) s]" | tee -a $R/date.txt; grep -E "decode" $R/attn.log
s=$SECONDS; timeout 150 python3 .devrun/attn_spb2.py > $R/attn-spb2.txt 2>&1; echo "== spb2 rc=$? [$((SECONDS-s)) s]" | tee -a $R/date.txt; grep dispatcher $R/attn-spb2.txt
mv $OUT/attn-spb2.json $R/ 2>/dev/null; tar czf $OUT/p5.tgz -C $OUT p5
