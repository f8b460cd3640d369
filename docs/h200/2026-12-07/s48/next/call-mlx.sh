#!/usr/bin/env bash
# Prepared in the forty-sixth session (which got no device time) for the next one, moved on
# by the forty-seventh and forty-eighth (no device time either); never ran. Run call-check.sh
# first (no MLX needed). Then, staged (carry [".stage2"]), as `T_ALL=540 bash call-mlx.sh`
# from the repository root (copy it there first if docs/ is moved out of the tree):
# 1. GPU tests of the Hopper attention (the ping-pong schedule, with cp.async and with TMA
#    copies, against lockstep and the mma.sync kernel: causal prefill at every edge, windows
#    over many passes, long rows and batches), the Hopper GEMM (the TMA configurations among
#    them), golden logs, bench, tools and concat under the default block-shape rule (the
#    forty-fifth session's change, not yet run on a GPU).
# 2. The ping-pong schedule (with and without TMA copies) timed against lockstep, one
#    warpgroup and stock, chained in one process (tools/attn_schedule_ab.py).
# 3. Rescoring at 8 x 512 and 4 x 8192 tokens with the schedule off and on
#    (BI_RL_HOPPER_PINGPONG), strict against off.
# 4. The Hopper GEMM at the rows rescoring at B = 8 makes (8 sequences of 406-606 tokens,
#    padded to the longest: 3,248-4,848 rows) on the 1.7B projections, chained, 128 x 256
#    blocks (auto) against the same blocks fed by TMA (PREFILL_TMA), 128 x 128 (MIDDLE, and
#    MIDDLE_TMA) and stock: what TMA copies gain, and how much the partial last wave of the
#    2048-column outputs costs (2.2-2.3 waves of 128 x 256 blocks on 132 multiprocessors);
#    then rescoring at 8 x 512 tokens with BI_RL_HOPPER_TMA=1 (and the ping-pong schedule on).
# 5. The forty-fifth session's leftovers as time allows (end to end with the schedule on at
#    B = 8, 4-bit at B = 8).
# Added in the forty-ninth session: the GPU tests of a mask noted with its window (the
# windowed caches' masks now carry their window to the kernels: same bits, less work) and
# tools/window_ab.py after the schedule A/B (noted mask against the same mask unnoted, the
# kernel's window and stock, 4096-key window, decode at 16384 / 32768 keys, prefill), and
# before the leftovers the round trips of two windowed families (bi-verify --model: a
# head-dim-128 Gemma 3 and gpt-oss, prompts crossing their windows, stock as the control).
python3 -P -c "import mlx.core" 2>/dev/null || { bash .stage2/install > /tmp/install.log 2>&1; echo "install rc=$? [$SECONDS s]"; }
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
T=${T_ALL:-540}
o=$OUT/n; mkdir -p $o
date -u +%FT%TZ | tee $o/date.txt
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $o/device.txt
python3 -P -c "from bi_rl._source import source_digest; print(source_digest())" > $o/source.txt
git log --oneline -1 > $o/commit.txt 2>/dev/null
M=/tmp/qwen3-1.7b-e2e
xd=""; python3 -P -c "import xdist" 2>/dev/null && xd="-p xdist -n 12"
FILES=${TEST_FILES:-tests/test_cuda_hopper_attention.py tests/test_cuda_hopper.py tests/test_rollouts_golden.py tests/test_bench.py tests/test_tools.py tests/test_concat.py tests/test_cuda_attention.py::test_a_mask_noted_with_its_window_keeps_its_bits tests/test_caches.py tests/test_cuda_launch.py}
timeout ${T_TESTS:-200} python3 -P -m pytest -q -p no:cacheprovider $xd -rf --tb=short \
  $FILES > $o/tests.log 2>&1
echo "tests rc=$? [$SECONDS s]"; grep -E "^FAILED|passed|failed" $o/tests.log | tail -8
timeout ${T_AB:-130} python3 -P tools/attn_schedule_ab.py --tokens 512,2048,8192,16384 --batch 1 \
  --head-dim 128,64 > $o/schedule-ab.jsonl 2> $o/schedule-ab.err
echo "schedule ab rc=$? [$SECONDS s]"; cut -c1-400 $o/schedule-ab.jsonl; tail -3 $o/schedule-ab.err
timeout 60 python3 -P tools/attn_schedule_ab.py --tokens 606 --batch 8 --head-dim 128 \
  >> $o/schedule-ab.jsonl 2>> $o/schedule-ab.err; tail -1 $o/schedule-ab.jsonl | cut -c1-400
timeout 90 python3 -P tools/window_ab.py --window 4096 --decode 8x16384,8x32768 \
  --prefill 2048,16384 > $o/window-ab.jsonl 2> $o/window-ab.err
echo "window ab rc=$? [$SECONDS s]"; cut -c1-400 $o/window-ab.jsonl; tail -3 $o/window-ab.err
for pp in 0 1; do
  left=$(( T - SECONDS )); [ $left -gt 60 ] || break
  BI_RL_HOPPER_PINGPONG=$pp timeout $left python3 -P -m bi_rl.cli.bench --only rescore-long -v \
    --repeats 5 --model-dir $M --models bf16 --long-batch 8 --long-length 512 \
    --json $o/rescore-8x512-pp$pp.json > $o/rescore-8x512-pp$pp.log 2>&1
  echo "rescore 8x512 pp=$pp rc=$? [$SECONDS s]"; tail -2 $o/rescore-8x512-pp$pp.log
done
for pp in 0 1; do
  left=$(( T - SECONDS )); [ $left -gt 60 ] || break
  BI_RL_HOPPER_PINGPONG=$pp timeout $left python3 -P -m bi_rl.cli.bench --only rescore-long -v \
    --repeats 3 --model-dir $M --models bf16 --json $o/rescore-long-pp$pp.json \
    > $o/rescore-long-pp$pp.log 2>&1; echo "rescore-long pp=$pp rc=$? [$SECONDS s]"
  tail -2 $o/rescore-long-pp$pp.log
done
left=$(( T - SECONDS ))
if [ $left -gt 90 ]; then
  timeout 90 python3 -P tools/hopper_ab.py --chain --configs auto,PREFILL_TMA,MIDDLE,MIDDLE_TMA \
    --ms 3248,4096,4720,4848 \
    --only 2048,2048 --only 6144,2048 --only 2048,4096 --only 2048,12288 \
    > $o/ab-rescore-rows.jsonl 2> $o/ab-rescore-rows.err
  echo "gemm ab at rescoring rows rc=$? [$SECONDS s]"; cut -c1-300 $o/ab-rescore-rows.jsonl
fi
left=$(( T - SECONDS ))
if [ $left -gt 60 ]; then
  BI_RL_HOPPER_PINGPONG=1 BI_RL_HOPPER_TMA=1 timeout $left python3 -P -m bi_rl.cli.bench \
    --only rescore-long -v --repeats 5 --model-dir $M --models bf16 --long-batch 8 \
    --long-length 512 --json $o/rescore-8x512-pp1-tma1.json > $o/rescore-8x512-pp1-tma1.log 2>&1
  echo "rescore 8x512 pp=1 tma=1 rc=$? [$SECONDS s]"; tail -2 $o/rescore-8x512-pp1-tma1.log
fi
left=$(( T - SECONDS ))
if [ $left -gt 120 ]; then  # the noted windows in a model: prompts cross the window
  T_MODEL=$(( (left - 30) / 2 )) bash tools/families_run.sh $o/families gemma3_text-hd128-bf16 \
    gpt_oss-bf16 > $o/families.log 2>&1
  echo "families rc=$? [$SECONDS s]"; grep -E "^== |^(PASS|FAIL)" $o/families.log
fi
e2e() {  # name, batches, model, extra env
  left=$(( T - SECONDS ))
  [ $left -gt 60 ] || { echo "$1 skipped: no time"; return; }
  env $4 timeout $left python3 -P -m bi_rl.cli.bench --only e2e -v --repeats 3 --model-dir $M \
    --batches $2 --models $3 --json $o/$1.json > $o/$1.log 2>&1
  echo "$1 rc=$? [$SECONDS s]"; grep " B=" $o/$1.log | tail -2
}
e2e b8-pp1 8 bf16 BI_RL_HOPPER_PINGPONG=1
e2e q4-b8 8 4-bit BI_RL_HOPPER_PINGPONG=0
tar czf $OUT/n.tgz -C $OUT n && rm -rf $o
