#!/usr/bin/env bash
# One call for what the 512-key default must pass, where only one call's time is left: the
# H200 golden logs re-made with rollouts/README.md's exact commands, rescored at batch 7
# shuffled and audited, then every GPU test file (with the new logs in place) in the time left
# before 575 s. Carry [".stage2"]; run from the repository root.
bash .stage2/install > /tmp/install.log 2>&1; echo "install rc=$? [$SECONDS s]"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
py="python3 -P"
o=$OUT/g; mkdir -p $o /tmp/golden
date -u +%FT%TZ | tee $o/date.txt
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $o/device.txt
$py tools/make_qwen2_05b.py /tmp/qwen2-05b > $o/make.log 2>&1; echo "model rc=$? [$SECONDS s]"
for m in bf16 q4; do
  log=rollouts/h200-qwen2-05b-$m.jsonl
  rm -f $log $log.run.json
  timeout 150 $py -m bi_rl.cli.rollout --model /tmp/qwen2-05b/$m --prompts /tmp/qwen2-05b/prompts.jsonl \
    --max-tokens 48 --batch-size 8 --out $log > $o/rollout-$m.log 2>&1; echo "rollout $m rc=$? [$SECONDS s]"
  cp $log /tmp/golden/ && cp $log $o/
  timeout 120 $py -m bi_rl.cli.rescore $log --batch-size 7 --report $o/rescore-$m.json \
    > $o/rescore-$m.log 2>&1; echo "rescore $m rc=$? [$SECONDS s]"; tail -4 $o/rescore-$m.log
  timeout 60 $py -m bi_rl.cli.audit $log > $o/audit-$m.log 2>&1; echo "audit $m rc=$?"; tail -2 $o/audit-$m.log
done
rm -f rollouts/*.run.json
JOBS=8 T_GPU=$((575 - SECONDS)) bash tools/cuda_device_run.sh $o gpu
gzip -f $o/gpu.log
tail -20 /tmp/install.log > $o/install_tail.log
tar czf $OUT/g.tgz -C $OUT g && rm -rf $o
