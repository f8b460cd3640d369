#!/usr/bin/env bash
# For the next device session, after staging (carry .stage2 on the first call). Parts:
#   gpu       every GPU test file to the end on main (PREFILL_DEEP is in configs(), so every
#             configuration comparison covers it); pytest -v names each test
#   deepab    ../deep_ab.py twice (the deeper pipeline against one stage less and stock)
#   bench     bi-bench --only gemm with BI_RL_HOPPER_DEEP=0, 1, 0, 1 (the dispatcher's table)
#   rescore   bi-bench --only rescore-long --models bf16 with BI_RL_HOPPER_DEEP=0 and 1
#   stall     ncu, one launch of the 4096-row q projection (deep 0 and 1): the full set with
#             the per-instruction SASS table (where the main loop's warps wait)
# Outputs under $OUT/n (n.tgz).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=$OUT/n; mkdir -p "$R"
pack() { (cd "$OUT" && tar czf n.tgz n); }
here=docs/h200/2026-12-03/s25
date -u +%FT%TZ | tee -a "$R/date.txt"
for part in ${PARTS:-gpu deepab bench}; do
  s=$SECONDS
  case $part in
    gpu) T_GPU=${T_GPU:-540} JOBS=${JOBS:-14} bash tools/cuda_device_run.sh "$R/gpu-main" gpu ;;
    deepab)
      for i in 1 2; do
        timeout 120 python3 -P $here/deep_ab.py > "$R/deep-$i.jsonl" 2>> "$R/deep.err"
        echo "deep_ab $i rc=$?"; cut -c1-120 "$R/deep-$i.jsonl"
      done ;;
    bench)
      for d in 0 1 0 1; do
        BI_RL_HOPPER_DEEP=$d timeout 120 python3 -P -m bi_rl.cli.bench --only gemm -v \
          --json "$R/gemm-deep$d-$SECONDS.json" > "$R/gemm-deep$d-$SECONDS.log" 2>&1
        echo "gemm deep=$d rc=$?"
      done
      grep -H "M=4096 K=2048 N=151936:" "$R"/gemm-deep*.log ;;
    rescore)
      for d in 0 1; do
        BI_RL_HOPPER_DEEP=$d timeout 240 python3 -P -m bi_rl.cli.bench --only rescore-long \
          --models bf16 --json "$R/rescore-deep$d.json" > "$R/rescore-deep$d.log" 2>&1
        echo "rescore-long deep=$d rc=$?"; tail -4 "$R/rescore-deep$d.log"
      done ;;
    stall)
      for d in 0 1; do
        BI_RL_HOPPER_DEEP=$d timeout 150 ncu --clock-control none --set full --import-source no \
          -k regex:hopper_gemm --launch-skip 2 --launch-count 1 -o "$R/gemm-q-deep$d" \
          python3 -P tools/cuda_profile.py gemm-m4096-q > "$R/stall-deep$d.log" 2>&1
        echo "ncu full deep=$d rc=$?"
        ncu -i "$R/gemm-q-deep$d.ncu-rep" --page source --csv --print-source sass \
          > "$R/gemm-q-deep$d-sass.csv" 2>> "$R/stall-deep$d.log"
        ncu -i "$R/gemm-q-deep$d.ncu-rep" --page details --section WarpStateStats \
          --section SchedulerStats | grep -E "Stall|Cycles Per|Eligible|Issued" | head -20
      done ;;
  esac
  echo "[$part: $((SECONDS - s)) s]" | tee -a "$R/date.txt"
  pack
done
