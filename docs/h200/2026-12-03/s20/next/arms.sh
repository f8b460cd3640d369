#!/usr/bin/env bash
# On this machine, before staging: arm ahead under .ab/ (ignored by git; carry `.ab` with
# `.stage2`) = main with combine-ahead.patch (split mode's combine reads 8 splits' partials
# before folding them; its test of the read-ahead edges). bi_rl/ (without its assets),
# kernels/ and tests/ are copied; main is the checkout itself.
set -eu
cd "$(git rev-parse --show-toplevel)"
rm -rf .ab/ahead
mkdir -p .ab/ahead && cp -r bi_rl kernels tests .ab/ahead/ && rm -rf .ab/ahead/bi_rl/assets
find .ab/ahead -name __pycache__ -prune -exec rm -rf {} +
(cd .ab/ahead && patch -p1 -s < ../../docs/h200/2026-12-03/s20/next/combine-ahead.patch)
grep -q '^/.ab/$' .git/info/exclude || echo "/.ab/" >> .git/info/exclude
du -sh .ab
