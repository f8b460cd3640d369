#!/usr/bin/env bash
# Run c (sixteenth session, second machine, after b): end to end at B = 1 and 8 on the models
# run b wrote, then one launch each of the wgmma prefill attention (8192 causal tokens, head
# dim 128, 16/8 heads) and stock's under Nsight Compute (full set, SASS source counters), and
# the SASS of the prefill attention cubins this machine compiled.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
[ -d /tmp/q17/q4 ] || { echo "no models: run b first on this machine"; exit 3; }
s=$SECONDS
timeout 330 python3 -m bi_rl.cli.bench --only e2e -v --repeats 3 --model-dir /tmp/q17 --batches 1,8 --json "$OUT/e2e.json" > "$OUT/e2e.log" 2>&1
echo "e2e rc=$? [$((SECONDS - s)) s]"; grep -v "first use" "$OUT/e2e.log" | tail -16
s=$SECONDS
timeout 200 ncu --clock-control none --profile-from-start off --set full --import-source no \
  -o "$OUT/prefill" python3 tools/attn_profile.py --case prefill > "$OUT/ncu.log" 2>&1
echo "ncu rc=$? [$((SECONDS - s)) s]"; tail -3 "$OUT/ncu.log"
if [ -f "$OUT/prefill.ncu-rep" ]; then
  ncu -i "$OUT/prefill.ncu-rep" --page details > "$OUT/prefill-details.txt" 2>&1
  ncu -i "$OUT/prefill.ncu-rep" --page source --print-source sass --csv > "$OUT/prefill-sass.csv" 2>&1 || true
  ls -la "$OUT"
  grep -E "Duration|Executed Ipc A|Issue Slots Busy|Registers Per|Warp Cycles Per Issued|No Eligible|Executed Instructions  " "$OUT/prefill-details.txt"
fi
mkdir -p "$OUT/sass"
for f in "${BI_RL_CUDA_CACHE:-$HOME/.cache/bi_rl/cuda}"/bi_hattn*.cubin; do
  [ -f "$f" ] && cuobjdump -sass "$f" > "$OUT/sass/$(basename "$f" .cubin).sass" 2>&1
done
ls "$OUT/sass" | head
