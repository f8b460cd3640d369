#!/usr/bin/env bash
# 512 keys a split as the default: the H200 golden logs re-made with the README's exact
# commands (kept in /tmp/golden for the next call on this machine), rescored at batch 7
# shuffled and audited, the stock control (--mode off) beside them, then the full bi-verify
# sweep in the time left (its log in /tmp resumes in a later call). Carry [".stage2"].
bash .stage2/install > /tmp/install.log 2>&1; echo "install rc=$?"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
py="python3 -P"
o=$OUT/g; mkdir -p $o /tmp/golden
date -u +%FT%TZ | tee $o/date.txt
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $o/device.txt
git log -1 --format=%H > $o/commit.txt 2>/dev/null || true
$py tools/make_qwen2_05b.py /tmp/qwen2-05b > $o/make.log 2>&1; echo "model rc=$?"
for m in bf16 q4; do
  log=rollouts/h200-qwen2-05b-$m.jsonl
  rm -f $log $log.run.json
  timeout 150 $py -m bi_rl.cli.rollout --model /tmp/qwen2-05b/$m --prompts /tmp/qwen2-05b/prompts.jsonl \
    --max-tokens 48 --batch-size 8 --out $log > $o/rollout-$m.log 2>&1; echo "rollout $m rc=$?"
  cp $log /tmp/golden/ && cp $log $o/
  timeout 120 $py -m bi_rl.cli.rescore $log --batch-size 7 --report $o/rescore-$m.json \
    > $o/rescore-$m.log 2>&1; echo "rescore $m rc=$?"; tail -4 $o/rescore-$m.log
  timeout 60 $py -m bi_rl.cli.audit $log > $o/audit-$m.log 2>&1; echo "audit $m rc=$?"; tail -2 $o/audit-$m.log
done
off=/tmp/golden/off-bf16.jsonl
timeout 150 $py -m bi_rl.cli.rollout --model /tmp/qwen2-05b/bf16 --prompts /tmp/qwen2-05b/prompts.jsonl \
  --max-tokens 48 --batch-size 8 --mode off --out $off --overwrite --quiet > $o/off.log 2>&1
timeout 120 $py -m bi_rl.cli.rescore $off --batch-size 7 --report $o/rescore-off-bf16.json \
  >> $o/off.log 2>&1; echo "stock control rescore rc=$?"; tail -4 $o/off.log
T_SWEEP=${T_SWEEP:-300} VERIFY_JOBS=10 bash tools/cuda_device_run.sh $o sweep
tail -20 /tmp/install.log > $o/install_tail.log
tar czf $OUT/g.tgz -C $OUT g && rm -rf $o
