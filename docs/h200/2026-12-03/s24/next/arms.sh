#!/usr/bin/env bash
# On this machine, before staging: arm bake = main with bake.patch (template arguments baked
# into the kernel bodies), under .ab/bake (ignored by git; carry `.ab/bake` with `.stage2`).
# bi_rl/ (without its assets), kernels/ and tests/ are copied; main is the checkout itself.
set -eu
cd "$(git rev-parse --show-toplevel)"
here=docs/h200/2026-12-03/s24/next
rm -rf .ab/bake
mkdir -p .ab/bake && cp -r bi_rl kernels tests .ab/bake/ && rm -rf .ab/bake/bi_rl/assets
find .ab/bake -name __pycache__ -prune -exec rm -rf {} +
(cd .ab/bake && patch -p1 -s < "../../$here/bake.patch")
grep -q '^/.ab/$' .git/info/exclude || echo "/.ab/" >> .git/info/exclude
du -sh .ab/bake
