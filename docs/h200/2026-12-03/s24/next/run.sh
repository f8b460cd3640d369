#!/usr/bin/env bash
# For the next device session, after arms.sh here and staging (README.md here). Parts:
#   checks    every GPU test file beside the full sweep on arm bake, then the arm's CPU test
#             of the baking (call 2, about 7 minutes)
#   gpu       main's GPU tests alone, to the end (pytest -v names each as it finishes)
#   sweep     the full bi-verify sweep on main
#   comb4     the attention GPU files on arm comb4, ncu of its combine and main's, decode_ab.py
#   probe     launch_probe.py on main, then host_probe.py main, bake, main, bake
#   step      step_probe.py main, bake, main, bake (a 1.7B decode step's graph building)
# Outputs under $OUT/n (n.tgz). Carry .ab/bake for checks, probe and step, .ab/comb4 for comb4.
set -u
export PYTHONUNBUFFERED=1
R=$OUT/n; mkdir -p "$R"
pack() { (cd "$OUT" && tar czf n.tgz n); }
arm() { case $1 in main) echo "$PWD" ;; *) echo "$PWD/.ab/$1" ;; esac; }
here=docs/h200/2026-12-03/s24/next
date -u +%FT%TZ | tee -a "$R/date.txt"
for a in bake comb4; do
  [ -d ".ab/$a" ] && ln -sfn "$PWD/bi_rl/assets" ".ab/$a/bi_rl/assets"
done
for part in ${PARTS:-checks}; do
  s=$SECONDS
  case $part in
    checks)
      # every GPU test file and the full sweep side by side, on arm bake (main's tests, the
      # arm's package and kernels), then the arm's own CPU test of the baking
      PYTHONPATH=$(arm bake) BI_RL_CUDA_CACHE=/tmp/nv-bake T_GPU=${T_GPU:-540} \
        T_SWEEP=${T_SWEEP:-540} JOBS=${JOBS:-12} bash tools/cuda_device_run.sh "$R/checks-bake" checks
      PYTHONPATH=$(arm bake) timeout 60 python3 -P -m pytest -q -p no:cacheprovider \
        .ab/bake/tests/test_cuda_bake.py > "$R/bake-cpu-tests.log" 2>&1
      echo "test_cuda_bake rc=$?"; tail -1 "$R/bake-cpu-tests.log" ;;
    gpu) T_GPU=${T_GPU:-540} JOBS=${JOBS:-14} bash tools/cuda_device_run.sh "$R/gpu-main" gpu ;;
    sweep) T_SWEEP=${T_SWEEP:-540} bash tools/cuda_device_run.sh "$R/sweep-main" sweep ;;
    comb4)
      # the attention GPU files on arm comb4, then ncu of the combine at B = 1 over 32768 keys
      # on both arms and decode_ab.py main / comb4 alternating
      PYTHONPATH=$(arm comb4) BI_RL_CUDA_CACHE=/tmp/nv-comb4 timeout ${T_ATT:-300} python3 -P -m pytest \
        -v -p no:cacheprovider -n 14 tests/test_cuda_attention.py tests/test_attention_window.py \
        tests/test_cuda_launch.py > "$R/attn-comb4.log" 2>&1
      echo "attention tests comb4 rc=$?"; tail -1 "$R/attn-comb4.log"
      grep -E "^(FAILED|ERROR)" "$R/attn-comb4.log" | head -8
      ARM=comb4 PARTS=combab bash docs/h200/2026-12-03/s23/next/run.sh ;;
    probe)
      timeout 120 python3 -P $here/launch_probe.py > "$R/launch.jsonl" 2> "$R/launch.err"
      echo "launch_probe rc=$?"; cat "$R/launch.jsonl"
      for a in main bake main bake; do
        echo "{\"arm\": \"$a\"}" >> "$R/host.jsonl"
        PYTHONPATH=$(arm $a) BI_RL_CUDA_CACHE=/tmp/nv-$a timeout 120 python3 -P \
          $here/host_probe.py >> "$R/host.jsonl" 2>> "$R/host.err"
        echo "host_probe $a rc=$?"
      done
      cat "$R/host.jsonl" ;;
    step)
      # one decode step's graph building on the 1.7B shape, main / bake alternating
      for a in main bake main bake; do
        PYTHONPATH=$(arm $a) BI_RL_CUDA_CACHE=/tmp/nv-$a timeout 150 python3 -P \
          $here/step_probe.py $a >> "$R/step.jsonl" 2>> "$R/step.err"
        echo "step_probe $a rc=$?"
      done
      cat "$R/step.jsonl" ;;
  esac
  echo "[$part: $((SECONDS - s)) s]" | tee -a "$R/date.txt"
  pack
done
