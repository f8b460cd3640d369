#!/usr/bin/env bash
# On this machine, before staging: arms under .ab/ (ignored by git): bake = main with
# bake.patch (template arguments baked into the kernel bodies), comb4 = main with comb4.patch
# (the combine reading four batches of 32 splits ahead). Carry `.ab/NAME`, one a call.
# bi_rl/ (without its assets), kernels/ and tests/ are copied; main is the checkout itself.
set -eu
cd "$(git rev-parse --show-toplevel)"
here=docs/h200/2026-12-03/s24/next
arm() {  # arm NAME PATCH
  rm -rf ".ab/$1"
  mkdir -p ".ab/$1" && cp -r bi_rl kernels tests ".ab/$1/" && rm -rf ".ab/$1/bi_rl/assets"
  find ".ab/$1" -name __pycache__ -prune -exec rm -rf {} +
  (cd ".ab/$1" && patch -p1 -s < "../../$here/$2.patch")
}
arm bake bake
arm comb4 comb4
grep -q '^/.ab/$' .git/info/exclude || echo "/.ab/" >> .git/info/exclude
du -sb .ab/*  # carry one arm a call: the tree, .stage2 and two arms pass 64 MiB
