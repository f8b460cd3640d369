# Dynamic instructions of the wgmma prefill attention by region, from run d's ncu source page
# (main's kernel, bf16, head dim 128, causal, two warpgroups, 8192 tokens): everything before
# the block loop (row ranges, Q, the pass search), the step without the fold, the step with
# it, and after the loop. The boundaries are the block loop's addresses in that listing
# (offsets from the kernel's first instruction), read off blocks.py's output.
import csv
import gzip
import sys

LOOP, FOLD, TAIL = 0x8680, 0xC4D0, 0x11970
with gzip.open(sys.argv[1], "rt") as fh:
    rows = list(csv.reader(fh))
hdr, ins = None, []
for r in rows[1:]:
    if r and r[0] == "Kernel Name":
        break
    if hdr is None:
        hdr = {h: i for i, h in enumerate(r)}
        continue
    ins.append(
        (int(r[hdr["Address"]], 16), int(r[hdr["Instructions Executed"]] or 0), r[hdr["Source"]])
    )
base = ins[0][0]
tot = sum(n for _, n, _ in ins)
reg = {"before the loop": 0, "step without fold": 0, "step with fold": 0, "loop end / after": 0}
for a, n, _src in ins:
    o = a - base
    k = (
        "before the loop"
        if o < LOOP
        else "step without fold"
        if o < FOLD
        else "step with fold"
        if o < TAIL
        else "loop end / after"
    )
    reg[k] += n
print(f"all: {tot:,} warp instructions")
for k, v in reg.items():
    print(f"  {k:20s} {v:>13,}  {100 * v / tot:5.1f}%")
