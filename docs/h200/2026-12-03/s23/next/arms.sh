#!/usr/bin/env bash
# On this machine, before staging: arm rows under .ab/ (ignored by git; carry `.ab` with
# `.stage2`) = main with rows.patch (one row-range loop for both attention kernels). bi_rl/
# (without its assets), kernels/ and tests/ are copied; main is the checkout itself.
set -eu
cd "$(git rev-parse --show-toplevel)"
here=docs/h200/2026-12-03/s23/next
rm -rf .ab/rows
mkdir -p .ab/rows && cp -r bi_rl kernels tests .ab/rows/ && rm -rf .ab/rows/bi_rl/assets
find .ab/rows -name __pycache__ -prune -exec rm -rf {} +
(cd .ab/rows && patch -p1 -s < "../../$here/rows.patch")
grep -q '^/.ab/$' .git/info/exclude || echo "/.ab/" >> .git/info/exclude
du -sh .ab
