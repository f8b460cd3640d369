#!/usr/bin/env bash
# bi-train on a GPU: LoRA GRPO on a random-weight Qwen3-1.7B-shaped model (bf16), on-policy to
# the bit in the mode, with stock MLX as the control. Logs and metrics under OUTDIR:
#   tests    the trainer and drop-in tests on the device (incl. the bf16 + float32-adapter gate)
#   strict   bi-train, 3 steps x 8 prompts x 4 samples, 2 epochs: expect exit 0, 0 differing
#            tokens and k3 = 0 on every step (train-strict.log, strict-metrics.jsonl)
#   gate     the same with --mode off: expect exit 1, the first divergent token named
#   off      --mode off --allow-off-policy: the control, k3 > 0 reported on every step
#   resume   2 steps, then --resume to 3: adapters must be the bytes of the strict run
# usage: bash tools/train_device_run.sh OUTDIR [part ...]   (default: all five)
# Run it from the repository root.
# MODEL_DIR (default /tmp/qwen3-1.7b) is built by tools/make_qwen3.py if missing;
# LAYERS=N builds a shallower model of the same widths. Each part has a time limit (seconds:
# T_TESTS, T_TRAIN).
set -u
usage="usage: bash tools/train_device_run.sh OUTDIR [tests strict gate off resume]"
case ${1:-} in
  -h|--help) sed -n '2,/^set -u/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
  ""|-*) echo "$usage" >&2; exit 2 ;;
esac
out=$1
shift
parts=${*:-tests strict gate off resume}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$(pwd)
# -P: `python3 -m` would otherwise put the working directory ahead of PYTHONPATH, so an arm
# named there (a patched copy of bi_rl elsewhere) would silently import this checkout's bi_rl
py="python3 -P"
models=${MODEL_DIR:-/tmp/qwen3-1.7b}
date -u +"%Y-%m-%dT%H:%MZ" | tee "$out/date.txt"
$py -c "import bi_rl, mlx.core as mx; print('bi_rl', bi_rl.__file__, 'mlx', mx.__version__, mx.default_device(), mx.cuda.is_available())"
if [ ! -d "$models/model" ]; then
  $py tools/make_qwen3.py "$models" ${LAYERS:+--layers $LAYERS} > "$out/make.log" 2>&1
  echo "make_qwen3 rc=$?"
fi
train() {  # train NAME ARGS...: one bi-train run, its log and metrics kept
  local name=$1; shift
  rm -rf "$out/ad-$name"
  timeout ${T_TRAIN:-420} $py -m bi_rl.cli.train --model "$models/model" \
    --prompts "$models/prompts.jsonl" --reward examples/rewards.py:even_tokens \
    --prompts-per-step 8 --n 4 --max-tokens 32 --epochs 2 --lr 1e-4 \
    --adapter-path "$out/ad-$name" "$@" > "$out/train-$name.log" 2>&1
  echo "train $name rc=$?"; tail -6 "$out/train-$name.log"
  [ -f "$out/ad-$name/metrics.jsonl" ] && cp "$out/ad-$name/metrics.jsonl" "$out/$name-metrics.jsonl"
}
for part in $parts; do
  start=$SECONDS
  case $part in
    tests)  timeout ${T_TESTS:-300} $py -m pytest -q -p no:cacheprovider tests/test_train_grpo.py \
              tests/test_train_lora.py tests/test_generate.py tests/test_cli_train.py \
              > "$out/tests.log" 2>&1
            echo "tests rc=$?"; tail -3 "$out/tests.log" ;;
    strict) train strict --steps 3 ;;
    gate)   train gate --steps 1 --mode off ;;
    off)    train off --steps 3 --mode off --allow-off-policy ;;
    resume) train resume --steps 2 --save-every 1
            timeout ${T_TRAIN:-420} $py -m bi_rl.cli.train --model "$models/model" \
              --prompts "$models/prompts.jsonl" --reward examples/rewards.py:even_tokens \
              --prompts-per-step 8 --n 4 --max-tokens 32 --epochs 2 --lr 1e-4 --steps 3 \
              --save-every 1 --adapter-path "$out/ad-resume" --resume >> "$out/train-resume.log" 2>&1
            echo "resume rc=$?"
            cmp "$out/ad-resume/adapters.safetensors" "$out/ad-strict/adapters.safetensors" \
              && echo "resume: adapters identical to the uninterrupted run" ;;
  esac
  echo "[$part: $((SECONDS - start)) s]"
done
