#!/usr/bin/env bash
# The model-family round trips, one `bi-verify --model` per model, logs and JSON under OUTDIR:
# random-weight models from tools/make_models.py (real widths, 2 layers; SMALL=1: CPU-sized),
# each rolled out at batch 8 and rescored at batch 3 shuffled in strict mode, bits compared,
# then the same on stock MLX as the control.
# usage: bash tools/families_run.sh OUTDIR [name ...]   (default: every name of
#        python tools/make_models.py --list)
# MODELS_DIR where the models are written (default /tmp/bi-rl-families, or -small with SMALL=1);
# T_MODEL the time limit per model in seconds (default 480); VERIFY_ARGS more bi-verify options
# (default --new-tokens 48). Run it from the repository root.
set -u
case ${1:-} in
  -h|--help) sed -n '2,/^set -u/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
  ""|-*) echo "usage: bash tools/families_run.sh OUTDIR [name ...]" >&2; exit 2 ;;
esac
out=$1
shift
export PYTHONUNBUFFERED=1 PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$(pwd)
# -P: `python3 -m` would otherwise put the working directory ahead of PYTHONPATH, so an arm
# named there (a patched copy of bi_rl elsewhere) would silently import this checkout's bi_rl
py="python3 -P"
small=${SMALL:+--small}
models=${MODELS_DIR:-/tmp/bi-rl-families${small:+-small}}
names=${*:-$($py tools/make_models.py --list)}
mkdir -p "$out"
date -u +"%Y-%m-%dT%H:%MZ" | tee "$out/date.txt"
$py -c "import bi_rl, mlx.core as mx, mlx_lm; print('bi_rl', bi_rl.__file__, 'mlx', mx.__version__, 'mlx-lm', mlx_lm.__version__, mx.default_device())"
for name in $names; do
  start=$SECONDS
  $py tools/make_models.py "$models" "$name" $small > "$out/$name.log" 2>&1
  timeout ${T_MODEL:-480} $py -m bi_rl.cli.verify --model "$models/$name" ${VERIFY_ARGS:---new-tokens 48} \
    --json "$out/$name.json" >> "$out/$name.log" 2>&1
  rc=$?
  echo "== $name rc=$rc [$((SECONDS - start)) s]"
  grep -E "^  (model|rollout|note|mode|stock)|^(PASS|FAIL|Control|Finding)" "$out/$name.log"
done
