#!/usr/bin/env bash
# For the next device session, after arms.sh here and staging. Call 2:
#   bash .stage2/install > /tmp/install.log 2>&1; PARTS=checks bash docs/h200/2026-12-03/s23/next/run.sh
# (carry .stage2 and .ab; about 8 minutes): every GPU test file and the full bi-verify sweep,
# side by side, on arm attn (main with rows.patch and comb.patch); main's tests run against
# the arm's package and kernels (tools/cuda_device_run.sh runs python with -P, so PYTHONPATH's arm comes first;
# its first line names the bi_rl it imported).
# Call 3 (carry .ab; about 2 minutes): PARTS=combab, the combine kernel in ncu and decode
# attention main / attn alternating (decode_ab.py).
# Call 4 (carry .ab; about 7 minutes): PARTS="h2tests h2ncu h2stall h2ab h2rt" for arm half2
# (main with half2.patch): its quantized GPU tests, ncu on both arms, ncu's warp states on
# half2, qmm_ab.py and bi-bench --only qmm alternating main / half2, and the 0.5B round trip
# whose 4-bit log is the new golden log.
set -u
export PYTHONUNBUFFERED=1
R=$OUT/n; mkdir -p "$R"
pack() { (cd "$OUT" && tar czf n.tgz n); }
arm() { case $1 in main) echo "$PWD" ;; *) echo "$PWD/.ab/$1" ;; esac; }
date -u +%FT%TZ | tee -a "$R/date.txt"
for a in attn half2; do
  [ -d ".ab/$a" ] || continue
  ln -sfn "$PWD/bi_rl/assets" ".ab/$a/bi_rl/assets"
done
for part in ${PARTS:-checks}; do
  s=$SECONDS
  case $part in
    checks)
      PYTHONPATH=$(arm attn) T_GPU=${T_GPU:-540} T_SWEEP=${T_SWEEP:-540} \
        bash tools/cuda_device_run.sh "$R/checks-attn" checks ;;
    combab)
      # the combine kernel alone in ncu (B = 1, 32768 keys, Qwen3-1.7B heads), then decode
      # attention at the pick beside stock, main / attn alternating (ARM names another arm)
      for a in ${ARM:-attn} main; do
        PYTHONPATH=$(arm $a) BI_RL_CUDA_CACHE=/tmp/nv-$a timeout 60 ncu --clock-control none \
          -k regex:combine --launch-skip 2 --launch-count 1 --metrics gpu__time_duration.sum \
          python3 -P "$PWD/tools/cuda_profile.py" decode-b1-32k-d128 > "$R/ncu-comb-$a.txt" 2>&1
        echo "ncu combine $a"; grep -E "duration" "$R/ncu-comb-$a.txt" | cut -c1-90
      done
      for a in main ${ARM:-attn} main ${ARM:-attn}; do
        PYTHONPATH=$(arm $a) BI_RL_CUDA_CACHE=/tmp/nv-$a timeout 120 python3 -P \
          docs/h200/2026-12-03/s23/next/decode_ab.py $a >> "$R/decode-ab.jsonl" 2>> "$R/decode-ab.err"
        echo "decode_ab $a rc=$?"
      done
      python3 -c "
import json, sys
for l in open(sys.argv[1]):
    r = json.loads(l); print(r['arm'], r['b'], r['keys'], round(r['ratio'], 2), round(r['ours_us'], 1))
" "$R/decode-ab.jsonl" ;;
    h2tests)
      # the new dequantisation test, every configuration against wgmma, the grouped entries
      PYTHONPATH=$(arm half2) BI_RL_CUDA_CACHE=/tmp/nv-half2 timeout 240 python3 -P -m pytest -q \
        -p no:cacheprovider -n 14 .ab/half2/tests/test_cuda_hopper.py .ab/half2/tests/test_cuda_qmm.py \
        .ab/half2/tests/test_fusion.py -k "quantized or qmm or rounded_once or dequant" \
        > "$R/tests-half2.log" 2>&1
      echo "tests half2 rc=$?"; tail -1 "$R/tests-half2.log"
      grep -E "^(FAILED|ERROR)" "$R/tests-half2.log" | head -8 ;;
    h2ncu)
      for a in half2 main; do
        PYTHONPATH=$(arm $a) BI_RL_CUDA_CACHE=/tmp/nv-$a timeout 60 ncu --clock-control none \
          -k regex:qmm --launch-skip 2 --launch-count 1 \
          --metrics gpu__time_duration.sum,smsp__inst_executed.sum \
          python3 -P "$PWD/tools/cuda_profile.py" qmm-m1-down > "$R/ncu-$a.txt" 2>&1
        echo "ncu $a"; grep -E "duration|inst_executed" "$R/ncu-$a.txt" | cut -c1-90
      done ;;
    h2stall)
      # where the few-row kernel's warps wait (one launch, M = 1, K = 6144, N = 2048): the
      # next step after the instruction count, which this kernel has been cutting so far
      PYTHONPATH=$(arm half2) BI_RL_CUDA_CACHE=/tmp/nv-half2 timeout 90 ncu --clock-control none \
        -k regex:qmm --launch-skip 2 --launch-count 1 --section WarpStateStats \
        --section SchedulerStats --section Occupancy \
        python3 -P "$PWD/tools/cuda_profile.py" qmm-m1-down > "$R/stall-half2.txt" 2>&1
      echo "stall rc=$?"; grep -E "Stall|Issued|Eligible|Active Warps|Occupancy" "$R/stall-half2.txt" \
        | cut -c1-100 | head -30 ;;
    h2ab)
      for a in main half2 main half2; do
        PYTHONPATH=$(arm $a) BI_RL_CUDA_CACHE=/tmp/nv-$a timeout 100 python3 -P \
          docs/h200/2026-12-03/s22/qmm_ab.py $a >> "$R/qmm-ab.jsonl" 2>> "$R/qmm-ab.err"
        echo "qmm_ab $a rc=$?"
      done
      for a in main half2; do  # M = 64 and up run the wgmma kernel's dequantisation
        PYTHONPATH=$(arm $a) BI_RL_CUDA_CACHE=/tmp/nv-$a timeout 150 python3 -P -m bi_rl.cli.bench \
          --only qmm -v --json "$R/qmm-$a.json" > "$R/qmm-$a.log" 2>&1
        echo "bench $a rc=$?"; grep -E "^qmm 4-bit g64 M=(1|64) K=" "$R/qmm-$a.log"
      done ;;
    h2rt)
      # the 0.5B round trip on half2: its rt-q4-strict.jsonl is the new rollouts/h200-qwen2-05b-q4.jsonl
      # (bf16 must come out identical to the committed log: no dense kernel changed)
      PYTHONPATH=$(arm half2) BI_RL_CUDA_CACHE=/tmp/nv-half2 bash tools/cuda_device_run.sh \
        "$R/rt-half2" roundtrip
      cmp "$R/rt-half2/rt-bf16-strict.jsonl" rollouts/h200-qwen2-05b-bf16.jsonl && echo "bf16 log unchanged" ;;
  esac
  echo "[$part: $((SECONDS - s)) s]" | tee -a "$R/date.txt"
  pack
done
