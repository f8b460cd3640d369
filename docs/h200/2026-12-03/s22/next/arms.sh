#!/usr/bin/env bash
# On this machine, before staging: arm pipe under .ab/ (ignored by git; carry `.ab` with
# `.stage2`) = main with pipe.patch (the few-row quantized kernel reading and dequantising a
# k-tile's fragments one k-tile ahead of its MMAs). bi_rl/ (without its assets), kernels/ and
# tests/ are copied; main is the checkout itself.
set -eu
cd "$(git rev-parse --show-toplevel)"
rm -rf .ab/pipe
mkdir -p .ab/pipe && cp -r bi_rl kernels tests .ab/pipe/ && rm -rf .ab/pipe/bi_rl/assets
find .ab/pipe -name __pycache__ -prune -exec rm -rf {} +
(cd .ab/pipe && patch -p1 -s < ../../docs/h200/2026-12-03/s22/next/pipe.patch)
grep -q '^/.ab/$' .git/info/exclude || echo "/.ab/" >> .git/info/exclude
du -sh .ab
