#!/usr/bin/env bash
# On this machine, before staging: arms under .ab/ (ignored by git; carry `.ab` with
# `.stage2`): attn = main with rows.patch (one row-range loop for both attention kernels) and
# comb.patch (the combine kernel's scan and warps), half2 = main with half2.patch (quantized
# weights dequantised by one half2 fma). bi_rl/ (without its assets), kernels/ and tests/ are
# copied; main is the checkout itself.
set -eu
cd "$(git rev-parse --show-toplevel)"
here=docs/h200/2026-12-03/s23/next
arm() {  # arm NAME PATCH...
  local a=$1
  shift
  rm -rf ".ab/$a"
  mkdir -p ".ab/$a" && cp -r bi_rl kernels tests ".ab/$a/" && rm -rf ".ab/$a/bi_rl/assets"
  find ".ab/$a" -name __pycache__ -prune -exec rm -rf {} +
  for p in "$@"; do (cd ".ab/$a" && patch -p1 -s < "../../$here/$p.patch"); done
}
rm -rf .ab/rows .ab/comb
arm attn rows comb
arm half2 half2
grep -q '^/.ab/$' .git/info/exclude || echo "/.ab/" >> .git/info/exclude
du -sh .ab
