# Next session, call 4: timings alone on the GPU, branch code (attention) and main (engine).
set -o pipefail
export PYTHONUNBUFFERED=1 BI_RL_CUDA_CACHE=/tmp/nvrtc-cache MLX_PTX_CACHE_DIR=/tmp/mlx-ptx
R=$OUT/n2; mkdir -p $R; date -u +%FT%TZ | tee $R/date.txt
B=$PWD/.devrun/branch
s=$SECONDS; (cd $B && PYTHONPATH=$B timeout 150 python3 -m bi_rl.cli.bench --only attention --json $R/attn.json > $R/attn.log 2>&1); echo "== attn rc=$? [$((SECONDS-s)) s]"
s=$SECONDS; (cd $B && PYTHONPATH=$B timeout 60 ncu --profile-from-start off --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --section MemoryWorkloadAnalysis python3 $OLDPWD/tools/attn_profile.py > $R/attn-ncu.txt 2>&1); echo "== ncu rc=$? [$((SECONDS-s)) s]"
s=$SECONDS; PYTHONPATH=$PWD timeout 200 python3 tools/engine_profile.py --model-dir /tmp/q17 --batch 64 --steps 96 --json $R/engine-b64.json > $R/engine-b64.log 2>&1; echo "== engine rc=$? [$((SECONDS-s)) s]"
s=$SECONDS; (cd $B && PYTHONPATH=$B timeout 60 python3 -m bi_rl.cli.bench --only rescore-long --model-dir /tmp/q17 --repeats 3 --json $R/rescore-long.json > $R/rescore-long.log 2>&1); echo "== rescore-long rc=$? [$((SECONDS-s)) s]"
tail -32 $R/attn.log; grep -E "Duration|Achieved Occupancy|Warp Cycles Per Issued|Registers Per|Memory Throughput  " $R/attn-ncu.txt | head -20; cat $R/engine-b64.log | tail -4; tail -4 $R/rescore-long.log
tar czf $OUT/n2.tgz -C $OUT n2
