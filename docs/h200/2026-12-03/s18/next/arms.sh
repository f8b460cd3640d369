#!/usr/bin/env bash
# On this machine, before staging: the arms run3.sh compares, under .ab/ (ignored by git; carry
# `.ab` with `.stage2`): main as checked out, and mask = main with mask-unit.patch. Only bi_rl/
# (without its assets) and kernels/ are copied, to stay under the 64 MiB a call may carry.
set -eu
cd "$(git rev-parse --show-toplevel)"
rm -rf .ab/main .ab/mask
for a in main mask; do
  mkdir -p .ab/$a && cp -r bi_rl kernels .ab/$a/ && rm -rf .ab/$a/bi_rl/assets
  find .ab/$a -name __pycache__ -prune -exec rm -rf {} +
done
(cd .ab/mask && patch -p1 -s < ../../docs/h200/2026-12-03/s18/next/mask-unit.patch)
grep -q '^/.ab/$' .git/info/exclude || echo "/.ab/" >> .git/info/exclude
du -sh .ab
