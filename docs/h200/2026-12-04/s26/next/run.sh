#!/usr/bin/env bash
# For the next device session, after staging (carry .stage2 on the first call). Parts:
#   gpu       every GPU test file to the end on main (PREFILL_DEEP is in configs(), TWO_PER_SM
#             and TWO_PER_SM_DEEP in variants(): every configuration comparison covers them)
#   hgpu      only the GEMM test files and the golden logs (what changed since the last full
#             run: the GEMM configurations; eac83a4's refactor left every kernel's PTX as it was)
#   tiles     tools/hopper_ab.py twice: PREFILL (base), PREFILL_DEEP, the two-per-SM 128 x 128
#             blocks with and without the deeper pipeline, and stock, on bi-bench's bf16 shapes
#             at 512 / 4096 / 16384 rows; then ncu's occupancy of the two-per-SM blocks
#   bench     bi-bench --only gemm with BI_RL_HOPPER_DEEP=0, 1, 0, 1 (the dispatcher's table)
#   rescore   bi-bench --only rescore-long --models bf16 with BI_RL_HOPPER_DEEP=0 and 1
#             (bench and rescore: the twenty-fifth session's run.sh parts, run from there)
#   stall     ncu --set full with the per-instruction SASS table: the 4096-row q projection on
#             PREFILL and on TWO_PER_SM (where the main loop's warps wait; STALL_CASES: others)
#   ws        applies ws.patch (the warp-specialised kernel, PREFILL_WS), runs its own GPU test
#             under a short limit first (a pipeline that deadlocks ends there), then the Hopper
#             GEMM test files and tools/hopper_ab.py (PREFILL, PREFILL_WS, PREFILL_DEEP), the
#             stall part on its q projection, and takes the patch back out
# Outputs under $OUT/n (n.tgz after each part).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=$OUT/n; mkdir -p "$R"
here=docs/h200/2026-12-04/s26/next
xd=$(python3 -c "import xdist" 2>/dev/null && echo "-p xdist -n 14")  # parallel where installed
pack() { (cd "$OUT" && tar czf n.tgz n); }
date -u +%FT%TZ | tee -a "$R/date.txt"
for part in ${PARTS:-gpu tiles}; do
  s=$SECONDS
  case $part in
    gpu) T_GPU=${T_GPU:-540} JOBS=${JOBS:-14} bash tools/cuda_device_run.sh "$R/gpu-main" gpu ;;
    hgpu)
      timeout 330 python3 -P -m pytest -v --durations=15 -p no:cacheprovider $xd \
        tests/test_cuda_hopper.py tests/test_cuda_qmm.py tests/test_cuda_gemm.py \
        tests/test_cuda_bake.py tests/test_rollouts_golden.py > "$R/hgpu.log" 2>&1
      echo "hopper GEMM GPU tests rc=$?"; tail -2 "$R/hgpu.log"
      grep -E "^(FAILED|ERROR)" "$R/hgpu.log" | head -20 ;;
    tiles)
      for i in 1 2; do
        timeout 200 python3 -P tools/hopper_ab.py \
          --configs PREFILL,PREFILL_DEEP,TWO_PER_SM,TWO_PER_SM_DEEP \
          > "$R/tiles-$i.jsonl" 2>> "$R/tiles.err"
        echo "hopper_ab $i rc=$?"; cut -c1-160 "$R/tiles-$i.jsonl"
      done
      timeout 90 ncu --clock-control none -k regex:hopper_gemm --launch-skip 2 --launch-count 1 \
        --section Occupancy --section LaunchStats --section SpeedOfLight \
        python3 -P tools/cuda_profile.py gemm-m4096-q-two > "$R/ncu-occ-two.txt" 2>&1
      echo "ncu occupancy rc=$?"
      grep -E "Block Limit|Theoretical Occ|Achieved Occ|Registers Per|Duration" "$R/ncu-occ-two.txt" ;;
    bench|rescore)  # the twenty-fifth session's parts, unchanged: DEEP 0/1 in bi-bench
      PARTS=$part bash docs/h200/2026-12-03/s25/next/run.sh ;;
    stall)
      for c in ${STALL_CASES:-gemm-m4096-q gemm-m4096-q-two}; do
        timeout 150 ncu --clock-control none --set full --import-source no \
          -k regex:hopper_gemm --launch-skip 2 --launch-count 1 -o "$R/$c" \
          python3 -P tools/cuda_profile.py $c > "$R/stall-$c.log" 2>&1
        echo "ncu full $c rc=$?"
        ncu -i "$R/$c.ncu-rep" --page source --csv --print-source sass \
          > "$R/$c-sass.csv" 2>> "$R/stall-$c.log"
        ncu -i "$R/$c.ncu-rep" --page details --section WarpStateStats \
          --section SchedulerStats | grep -E "Stall|Cycles Per|Eligible|Issued" | head -20
      done ;;
    ws)
      git apply "$here/ws.patch" 2>> "$R/ws.err" || patch -p1 < "$here/ws.patch" >> "$R/ws.err" 2>&1
      echo "ws.patch applied rc=$?"
      timeout 180 python3 -P -m pytest -x -v -p no:cacheprovider tests/test_cuda_hopper.py \
        -k warp_specialised > "$R/ws-smoke.log" 2>&1
      rc=$?; echo "ws smoke rc=$rc"; tail -3 "$R/ws-smoke.log"
      if [ $rc -eq 0 ]; then
        timeout 300 python3 -P -m pytest -q -p no:cacheprovider $xd tests/test_cuda_hopper.py \
          tests/test_cuda_bake.py > "$R/ws-tests.log" 2>&1
        echo "ws tests rc=$?"; tail -3 "$R/ws-tests.log"
        timeout 200 python3 -P tools/hopper_ab.py --configs PREFILL,PREFILL_WS,PREFILL_WS_PERSIST,TWO_PER_SM_WS,PREFILL_DEEP \
          > "$R/ws-ab.jsonl" 2>> "$R/ws.err"
        echo "ws ab rc=$?"; cut -c1-160 "$R/ws-ab.jsonl"
        PARTS=stall STALL_CASES=gemm-m4096-q-ws bash "$0"  # the patch's kernel, applied now
      fi
      git apply -R "$here/ws.patch" 2>> "$R/ws.err" || patch -R -p1 < "$here/ws.patch" >> "$R/ws.err" 2>&1
      echo "ws.patch taken out rc=$?" ;;
  esac
  echo "[$part: $((SECONDS - s)) s]" | tee -a "$R/date.txt"
  pack
done
