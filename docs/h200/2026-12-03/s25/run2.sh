#!/usr/bin/env bash
# Twenty-fifth session, second machine (after staging; carry .stage2): the persistent GEMM
# blocks (PREFILL_PERSIST, opt-in with BI_RL_HOPPER_PERSIST=1). Parts, in order:
#   tests    the Hopper GEMM, quantized GEMM, grouping and baking test files: every
#            configuration bit for bit, the persistent blocks at 1, 5 and 132 blocks
#   ab       persist_ab.py: persistent against one block a tile and stock, one process
#   bench    bi-bench --only gemm with BI_RL_HOPPER_PERSIST=1 (the dispatcher takes it)
# Outputs under $OUT/p (p.tgz).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=$OUT/p; mkdir -p "$R"
pack() { (cd "$OUT" && tar czf p.tgz p); }
date -u +%FT%TZ | tee -a "$R/date.txt"
for part in ${PARTS:-tests ab bench}; do
  s=$SECONDS
  case $part in
    tests)
      timeout ${T_TESTS:-260} python3 -P -m pytest -v -p no:cacheprovider -n 14 --durations=10 \
        tests/test_cuda_hopper.py tests/test_cuda_qmm.py tests/test_fusion.py \
        tests/test_cuda_bake.py > "$R/tests.log" 2>&1
      echo "tests rc=$?"; tail -1 "$R/tests.log"; grep -E "^(FAILED|ERROR)" "$R/tests.log" | head
      grep -E "persistent" "$R/tests.log" | grep -E "PASSED|FAILED" | cut -c1-150 | head -8 ;;
    ab)
      timeout ${T_AB:-200} python3 -P docs/h200/2026-12-03/s25/persist_ab.py > "$R/persist.jsonl" 2> "$R/persist.err"
      echo "persist_ab rc=$?"; cat "$R/persist.jsonl"; tail -3 "$R/persist.err" ;;
    bench)
      BI_RL_HOPPER_PERSIST=1 timeout ${T_BENCH:-120} python3 -P -m bi_rl.cli.bench --only gemm -v \
        --json "$R/gemm-persist.json" > "$R/gemm-persist.log" 2>&1
      echo "gemm bench persist rc=$?"; grep -E "M=(512|4096|16384) " "$R/gemm-persist.log" | cut -c1-80 ;;
  esac
  echo "[$part: $((SECONDS - s)) s]" | tee -a "$R/date.txt"
  pack
done
