#!/usr/bin/env bash
# On this machine, before staging: arm range under .ab/ (ignored by git; carry `.ab` with
# `.stage2`) = main with row-range.patch. Only bi_rl/ (without its assets) and kernels/ are
# copied, to stay under the 64 MiB a call may carry; main is the checkout itself.
set -eu
cd "$(git rev-parse --show-toplevel)"
rm -rf .ab/range
mkdir -p .ab/range && cp -r bi_rl kernels .ab/range/ && rm -rf .ab/range/bi_rl/assets
find .ab/range -name __pycache__ -prune -exec rm -rf {} +
(cd .ab/range && patch -p1 -s < ../../docs/h200/2026-12-03/s19/next/row-range.patch)
grep -q '^/.ab/$' .git/info/exclude || echo "/.ab/" >> .git/info/exclude
du -sh .ab
