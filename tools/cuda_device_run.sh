#!/usr/bin/env bash
# Everything the CUDA backend claims, checked on the device in one go, logs under OUTDIR:
#   tests   the CUDA kernel tests (bitwise invariance, accuracy vs float64, stock controls)
#   e2e     tools/cuda_e2e.py: 0.5B-shaped Qwen2 bf16 + 4-bit, alone vs batch vs rescoring
#   bench   bi-bench: kernel timings beside stock MLX, ratios and errors vs float64
#   verify  bi-verify: the invariance sweep with its stock control
#   roundtrip  bi-rollout then bi-rescore (and bi-audit) on the 0.5B-shaped Qwen2, bf16 and 4-bit
#   suite   the backend-agnostic invariance tests, engine and scorer tests, on the GPU
#   tune    tools/cuda_tune.py: every tile configuration timed beside stock, bits compared
#   families  tools/families_run.sh: bi-verify --model on random-weight real-width MoE,
#           Gemma 2/3 and gpt-oss models (FAMILIES picks names: tools/make_models.py --list)
#   gpu     every test file with GPU paths (CUDA kernels, windows, the H200 golden logs,
#           fusion, engine, scorer, trainer, bi-rescore), in JOBS pytest-xdist workers
#   sweep   the full bi-verify sweep in VERIFY_JOBS workers, logged to SWEEP_LOG so that a
#           call stopped by its limit resumes there (run the part again); SWEEP_ARGS adds
#           options (--quick: the CPU-sized sweep, to try the part on a CPU)
#   checks  gpu and sweep side by side (both check bits, not speed, so they may share the
#           GPU; on a machine that has compiled nothing, about 6-7 minutes for both)
#   e2e17   bi-bench end to end on the Qwen3-1.7B shape (models under MODEL_DIR, written if
#           missing; BATCHES, default 1,8,64; E2E_MODELS, default both: bf16, 4-bit) with
#           mlx-lm's batch_generate beside it, then long-context rescoring (4 x 8192 tokens)
#   split   the attention split size (BI_RL_ATTN_SPLIT): the attention GPU tests at each of
#           SPLITS (default 512) in their own process, then bi-bench's attention table at
#           256 and at each of SPLITS, ROUNDS (default 2) times in turn (one size a process)
# usage: bash tools/cuda_device_run.sh OUTDIR [part ...]      (default: the first four)
# Run it from the repository root.
# BENCH_ARGS passes options to bi-bench (e.g. "--only e2e"), TESTS_ARGS to pytest (e.g. -k ...),
# VERIFY_ARGS to bi-verify (e.g. --quick); a prebuilt kernel cache is used
# when MLX_PTX_CACHE_DIR points at one.
# Each part has a time limit (seconds) so that one slow part cannot eat the others.
set -u
usage="usage: bash tools/cuda_device_run.sh OUTDIR [tests e2e bench verify roundtrip suite tune families gpu sweep checks e2e17 split]"
case ${1:-} in
  -h|--help) sed -n '2,/^set -u/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
  ""|-*) echo "$usage" >&2; exit 2 ;;
esac
out=$1
shift
parts=${*:-tests e2e bench verify}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$(pwd)
# -P: `python3 -m` would otherwise put the working directory ahead of PYTHONPATH, so an arm
# named there (a patched copy of bi_rl elsewhere) would silently import this checkout's bi_rl
py="python3 -P"
date -u +"%Y-%m-%dT%H:%MZ" | tee "$out/date.txt"
$py -c "import bi_rl, mlx.core as mx; print('bi_rl', bi_rl.__file__, 'mlx', mx.__version__, mx.default_device(), mx.cuda.is_available())"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader || true
GPU_TESTS="tests/test_cuda_*.py tests/test_attention_window.py tests/test_rollouts_golden.py
  tests/test_train_grpo.py tests/test_fusion.py tests/test_engine.py tests/test_mode.py
  tests/test_generate.py tests/test_scorer.py tests/test_policy.py tests/test_cli_rescore.py
  tests/test_concat.py"
gpu_tests() {
  local s=$SECONDS xdist=""
  $py -c "import xdist" 2>/dev/null && xdist="-p xdist -n ${JOBS:-8}"
  # -v names each test as it finishes, so a run cut by its limit still says which tests did
  # not finish; --durations names the slow ones of a run that completes
  # shellcheck disable=SC2086
  timeout ${T_GPU:-540} $py -m pytest -v --durations=25 -p no:cacheprovider $xdist $GPU_TESTS \
    > "$out/gpu.log" 2>&1
  echo "gpu tests rc=$? [$((SECONDS - s)) s]"; tail -2 "$out/gpu.log"
  grep -E "^(FAILED|ERROR)" "$out/gpu.log" | head -20
}
split_sizes() {
  local xdist="" keys round
  $py -c "import xdist" 2>/dev/null && xdist="-p xdist -n ${JOBS:-8}"
  for keys in ${SPLITS:-512}; do
    # shellcheck disable=SC2086
    BI_RL_ATTN_SPLIT=$keys timeout ${T_SPLIT_TESTS:-240} $py -m pytest -q -p no:cacheprovider \
      $xdist tests/test_cuda_attention.py tests/test_cuda_hopper_attention.py \
      > "$out/split-$keys-tests.log" 2>&1
    echo "attention tests at $keys keys a split rc=$?"; tail -2 "$out/split-$keys-tests.log"
  done
  for round in $(seq ${ROUNDS:-2}); do
    for keys in 256 ${SPLITS:-512}; do
      BI_RL_ATTN_SPLIT=$keys timeout ${T_SPLIT_BENCH:-150} $py -m bi_rl.cli.bench \
        --only attention --json "$out/attn-$keys-$round.json" > "$out/attn-$keys-$round.log" 2>&1
      echo "attention bench at $keys keys a split, round $round: rc=$?"
    done
  done
}
sweep() {
  local s=$SECONDS
  timeout ${T_SWEEP:-540} $py -m bi_rl.cli.verify --jobs ${VERIFY_JOBS:-10} ${SWEEP_ARGS:-} \
    --log "${SWEEP_LOG:-/tmp/bi-verify-sweep.jsonl}" --resume --json "$out/sweep.json" \
    > "$out/sweep.log" 2>&1
  echo "sweep rc=$? [$((SECONDS - s)) s]"; tail -3 "$out/sweep.log"
}
for part in $parts; do
  start=$SECONDS
  case $part in
    tests)  timeout ${T_TESTS:-300} $py -m pytest -q -s -p no:cacheprovider --durations=12 ${TESTS_ARGS:-} \
              tests/test_cuda_gemm.py tests/test_cuda_qmm.py tests/test_cuda_attention.py \
              > "$out/tests.log" 2>&1
            echo "tests rc=$?"; grep -E "passed|failed|error" "$out/tests.log" | tail -3
            grep -E "^(FAILED|ERROR)" "$out/tests.log" | head -20 ;;
    e2e)    timeout ${T_E2E:-200} $py tools/cuda_e2e.py --json "$out/e2e.json" \
              > "$out/e2e.log" 2>&1
            echo "e2e rc=$?"; tail -7 "$out/e2e.log" ;;
    bench)  timeout ${T_BENCH:-240} $py -m bi_rl.cli.bench -v ${BENCH_ARGS:-} --json "$out/bench.json" \
              > "$out/bench.log" 2>&1
            echo "bench rc=$?"; grep -E "MISS|ratio|gemm|qmm|attention" "$out/bench.log" | tail -60 ;;
    verify) timeout ${T_VERIFY:-200} $py -m bi_rl.cli.verify ${VERIFY_ARGS:-} --json "$out/verify.json" \
              > "$out/verify.log" 2>&1
            echo "verify rc=$?"; tail -25 "$out/verify.log" ;;
    roundtrip)
            models=${MODELS:-/tmp/qwen2-05b}
            [ -d "$models/q4" ] || $py tools/make_qwen2_05b.py "$models" > "$out/roundtrip.log" 2>&1
            for m in bf16 q4; do
              for mode in strict off; do
                log=$out/rt-$m-$mode.jsonl
                timeout ${T_RT:-120} $py -m bi_rl.cli.rollout --model "$models/$m" \
                  --prompts "$models/prompts.jsonl" --max-tokens 48 --batch-size 8 --mode $mode \
                  --out "$log" --overwrite --quiet >> "$out/roundtrip.log" 2>&1
                timeout ${T_RT:-120} $py -m bi_rl.cli.rescore "$log" --model "$models/$m" \
                  --mode $mode --report "$out/rescore-$m-$mode.json" >> "$out/roundtrip.log" 2>&1
                echo "roundtrip $m mode=$mode rescore rc=$?"
              done
              timeout 60 $py -m bi_rl.cli.audit "$out/rt-$m-strict.jsonl" >> "$out/roundtrip.log" 2>&1
              echo "audit $m rc=$?"
            done
            grep -E "^(OK|DIFF|FAIL)|differ" "$out/roundtrip.log" | tail -12 ;;
    tune)   timeout ${T_TUNE:-300} $py tools/cuda_tune.py --json "$out/tune.json" \
              > "$out/tune.log" 2>&1
            echo "tune rc=$?"; sed -n '/^best per case/,$p' "$out/tune.log" ;;
    suite)  timeout ${T_SUITE:-200} $py -m pytest -q -p no:cacheprovider \
              tests/test_backend_invariance.py tests/test_mode.py tests/test_engine.py \
              tests/test_scorer.py tests/test_logprobs.py tests/test_rollouts_golden.py \
              tests/test_composed.py tests/test_caches.py tests/test_families.py \
              > "$out/suite.log" 2>&1
            echo "suite rc=$?"; tail -5 "$out/suite.log" ;;
    families)
            bash tools/families_run.sh "$out/families" ${FAMILIES:-} ;;
    gpu)    gpu_tests ;;
    sweep)  sweep ;;
    checks) gpu_tests & sweep; wait ;;
    e2e17)  timeout ${T_E2E17:-560} $py -m bi_rl.cli.bench --only e2e -v --repeats ${REPEATS:-3} \
              --model-dir "${MODEL_DIR:-/tmp/qwen3-1.7b-e2e}" --batches "${BATCHES:-1,8,64}" \
              ${E2E_MODELS:+--models "$E2E_MODELS"} --json "$out/e2e17.json" > "$out/e2e17.log" 2>&1
            echo "e2e17 rc=$?"; tail -12 "$out/e2e17.log"
            timeout ${T_LONG:-200} $py -m bi_rl.cli.bench --only rescore-long -v \
              --model-dir "${MODEL_DIR:-/tmp/qwen3-1.7b-e2e}" \
              ${E2E_MODELS:+--models "$E2E_MODELS"} --json "$out/rescore-long.json" \
              > "$out/rescore-long.log" 2>&1
            echo "rescore-long rc=$?"; tail -5 "$out/rescore-long.log" ;;
    split)  split_sizes ;;
    *)      echo "unknown part $part: $usage" >&2 ;;
  esac
  echo "[$part: $((SECONDS - start)) s]"
done
# Kernels MLX compiled here because the prebuilt cache lacked them: keep them for next time.
if [ -n "${MLX_PTX_CACHE_DIR:-}" ] && [ -d "$MLX_PTX_CACHE_DIR" ]; then
  (cd "$MLX_PTX_CACHE_DIR" && find . -newer "$out/date.txt" -type f -print0 \
    | tar czf "$out/ptx-new.tgz" --null -T - && echo "new cache entries: $(tar tzf "$out/ptx-new.tgz" | wc -l)")
fi
