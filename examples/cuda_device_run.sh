#!/usr/bin/env bash
# Everything the CUDA backend claims, checked on the device in one go, logs under OUTDIR:
#   tests   the CUDA kernel tests (bitwise invariance, accuracy vs float64, stock controls)
#   e2e     examples/cuda_e2e.py: 0.5B-shaped Qwen2 bf16 + 4-bit, alone vs batch vs rescoring
#   bench   bi-bench: kernel timings beside stock MLX, ratios and errors vs float64
#   verify  bi-verify: the invariance sweep with its stock control
# usage: bash examples/cuda_device_run.sh OUTDIR [part ...]      (default: all four, in order)
# Each part has a time limit (seconds) so that one slow part cannot eat the others.
set -u
out=${1:?usage: cuda_device_run.sh OUTDIR [tests] [e2e] [bench] [verify]}
shift
parts=${*:-tests e2e bench verify}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$(pwd)
py=python3
date -u +"%Y-%m-%dT%H:%MZ" | tee "$out/date.txt"
$py -c "import mlx.core as mx; print('mlx', mx.__version__, mx.default_device(), mx.cuda.is_available())"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader || true
for part in $parts; do
  start=$SECONDS
  case $part in
    tests)  timeout ${T_TESTS:-300} $py -m pytest -q -s -p no:cacheprovider --durations=12 \
              tests/test_cuda_gemm.py tests/test_cuda_qmm.py tests/test_cuda_attention.py \
              > "$out/tests.log" 2>&1
            echo "tests rc=$?"; grep -E "passed|failed|error" "$out/tests.log" | tail -3
            grep -E "^(FAILED|ERROR)" "$out/tests.log" | head -20 ;;
    e2e)    timeout ${T_E2E:-200} $py examples/cuda_e2e.py --json "$out/e2e.json" \
              > "$out/e2e.log" 2>&1
            echo "e2e rc=$?"; tail -7 "$out/e2e.log" ;;
    bench)  timeout ${T_BENCH:-240} $py -m bi_rl.cli.bench -v --json "$out/bench.json" \
              > "$out/bench.log" 2>&1
            echo "bench rc=$?"; grep -E "MISS|ratio|gemm|qmm|attention" "$out/bench.log" | tail -60 ;;
    verify) timeout ${T_VERIFY:-200} $py -m bi_rl.cli.verify ${VERIFY_ARGS:-} --json "$out/verify.json" \
              > "$out/verify.log" 2>&1
            echo "verify rc=$?"; tail -25 "$out/verify.log" ;;
  esac
  echo "[$part: $((SECONDS - start)) s]"
done
