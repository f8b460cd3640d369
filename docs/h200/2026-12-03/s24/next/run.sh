#!/usr/bin/env bash
# For the next device session, after arms.sh here and staging (README.md here). Parts:
#   gpu       main's GPU tests alone, to the end (pytest -v names each as it finishes)
#   sweep     the full bi-verify sweep on main
#   bakegpu   every GPU test file on arm bake (main's tests, the arm's package and kernels:
#             tools/cuda_device_run.sh runs python -P, so PYTHONPATH's arm comes first),
#             then the arm's own tests/test_cuda_bake.py
#   probe     launch_probe.py on main, then host_probe.py main, bake, main, bake
# Outputs under $OUT/n (n.tgz). Carry .ab/bake for bakegpu and probe.
set -u
export PYTHONUNBUFFERED=1
R=$OUT/n; mkdir -p "$R"
pack() { (cd "$OUT" && tar czf n.tgz n); }
arm() { case $1 in main) echo "$PWD" ;; *) echo "$PWD/.ab/$1" ;; esac; }
here=docs/h200/2026-12-03/s24/next
date -u +%FT%TZ | tee -a "$R/date.txt"
[ -d .ab/bake ] && ln -sfn "$PWD/bi_rl/assets" .ab/bake/bi_rl/assets
for part in ${PARTS:-gpu}; do
  s=$SECONDS
  case $part in
    gpu) T_GPU=${T_GPU:-540} JOBS=${JOBS:-14} bash tools/cuda_device_run.sh "$R/gpu-main" gpu ;;
    sweep) T_SWEEP=${T_SWEEP:-540} bash tools/cuda_device_run.sh "$R/sweep-main" sweep ;;
    bakegpu)
      PYTHONPATH=$(arm bake) BI_RL_CUDA_CACHE=/tmp/nv-bake T_GPU=${T_GPU:-540} JOBS=${JOBS:-14} \
        bash tools/cuda_device_run.sh "$R/gpu-bake" gpu
      PYTHONPATH=$(arm bake) timeout 60 python3 -P -m pytest -q -p no:cacheprovider \
        .ab/bake/tests/test_cuda_bake.py > "$R/bake-cpu-tests.log" 2>&1
      echo "test_cuda_bake rc=$?"; tail -1 "$R/bake-cpu-tests.log" ;;
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
  esac
  echo "[$part: $((SECONDS - s)) s]" | tee -a "$R/date.txt"
  pack
done
