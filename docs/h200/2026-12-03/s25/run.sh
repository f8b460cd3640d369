#!/usr/bin/env bash
# Twenty-fifth session, last call (after staging; carry .stage2): main with the template
# baking merged (86ad59a). Parts, in order:
#   guard   the rank-free GEMM test whose launch check changed with the baking (it failed on
#           the arm only for comparing kernel objects), and the baking's CPU test
#   gemm    bi-bench --only gemm: the dense bf16 family at M = 1 .. 16384 on the Qwen3-1.7B
#           and Llama-3-8B projections, ours beside stock (last run whole in the third session)
#   ncu     the 4096-row q projection and logits GEMM, ours and stock's cuBLAS kernel: speed of
#           light, warp states, occupancy (what holds the large-M kernel at its ratio)
#   probe   the launch probe with bi_rl importable (its real-launch part failed before)
# Outputs under $OUT/r (r.tgz).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=$OUT/r; mkdir -p "$R"
pack() { (cd "$OUT" && tar czf r.tgz r); }
date -u +%FT%TZ | tee -a "$R/date.txt"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader | tee -a "$R/date.txt"
for part in ${PARTS:-guard gemm ncu probe}; do
  s=$SECONDS
  case $part in
    guard)
      timeout 240 python3 -P -m pytest -v -p no:cacheprovider -n 8 tests/test_cuda_hopper.py \
        tests/test_cuda_bake.py -k "any_rank or bake or launch" > "$R/guard.log" 2>&1
      echo "guard rc=$?"; tail -1 "$R/guard.log"; grep -E "^(FAILED|ERROR)" "$R/guard.log" | head ;;
    gemm)
      timeout 300 python3 -P -m bi_rl.cli.bench --only gemm -v --json "$R/gemm.json" \
        > "$R/gemm.log" 2>&1
      echo "gemm bench rc=$?"; grep -E "M=(4096|16384)" "$R/gemm.log" | cut -c1-120 ;;
    ncu)
      for c in gemm-m4096-q gemm-m4096-logits; do
        for side in ours stock; do
          if [ $side = ours ]; then k="regex:hopper_gemm"; n=$c; else k="regex:gemm|nvjet|cutlass"; n=stock-$c; fi
          timeout 90 ncu --clock-control none -k "$k" --launch-skip 2 --launch-count 1 \
            --section SpeedOfLight --section WarpStateStats --section Occupancy \
            --section ComputeWorkloadAnalysis python3 -P tools/cuda_profile.py "$n" \
            > "$R/ncu-$n.txt" 2>&1
          echo "ncu $n rc=$?"
          grep -E "^  [a-z_0-9]+.*\(|Duration|Compute \(SM\) Throughput|Memory Throughput|Issue Slots Busy|Executed Ipc A|Achieved Occupancy|Warp Cycles Per Issued" "$R/ncu-$n.txt" | cut -c1-110 | head -12
        done
      done ;;
    probe)
      timeout 120 python3 -P docs/h200/2026-12-03/s24/next/launch_probe.py > "$R/launch.jsonl" 2> "$R/launch.err"
      echo "launch_probe rc=$?"; cat "$R/launch.jsonl"; tail -3 "$R/launch.err" ;;
  esac
  echo "[$part: $((SECONDS - s)) s]" | tee -a "$R/date.txt"
  pack
done
