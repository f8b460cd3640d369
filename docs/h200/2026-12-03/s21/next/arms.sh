#!/usr/bin/env bash
# On this machine, before staging: arm prod under .ab/ (ignored by git; carry `.ab` with
# `.stage2`) = main with producers.patch (the few-row quantized kernel's 16-column blocks
# with four producer warps dequantising for the two chain warps). bi_rl/ (without its
# assets), kernels/ and tests/ are copied; main is the checkout itself.
set -eu
cd "$(git rev-parse --show-toplevel)"
rm -rf .ab/prod
mkdir -p .ab/prod && cp -r bi_rl kernels tests .ab/prod/ && rm -rf .ab/prod/bi_rl/assets
find .ab/prod -name __pycache__ -prune -exec rm -rf {} +
(cd .ab/prod && patch -p1 -s < ../../docs/h200/2026-12-03/s21/next/producers.patch)
grep -q '^/.ab/$' .git/info/exclude || echo "/.ab/" >> .git/info/exclude
du -sh .ab
