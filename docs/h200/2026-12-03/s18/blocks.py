# Basic-block view of an ncu SASS source page (gzip CSV, the first kernel in it): runs of
# consecutive instructions with the same execution count, each with its offset from the
# kernel's first instruction, its count, its length, its share of all executed instructions
# and of the stall samples, and its opcodes (runs compressed). argv[2]: the least share shown.
#     python3 blocks.py d/prefill-sass.csv.gz 0.003
import csv
import gzip
import re
import sys

with gzip.open(sys.argv[1], "rt") as fh:
    rows = list(csv.reader(fh))
name, hdr, ins = None, None, []
for r in rows:
    if r and r[0] == "Kernel Name":
        if ins:
            break
        name, hdr = r[1], None
        continue
    if hdr is None:
        hdr = {h: i for i, h in enumerate(r)}
        continue
    try:
        addr = int(r[hdr["Address"]], 16)
        count = int(r[hdr["Instructions Executed"]] or 0)
        samples = int(r[hdr["Warp Stall Sampling (All Samples)"]] or 0)
    except ValueError:
        continue
    ins.append((addr, r[hdr["Source"]].strip(), count, samples))
base = ins[0][0]
total = sum(i[2] for i in ins)
stalls = sum(i[3] for i in ins)
print(name[:60], "executed", total, "samples", stalls)
blocks, cur = [], None
for addr, src, count, samples in ins:
    op = re.sub(r"^@!?U?P\w+\s+", "", src).split(" ")[0].split(".")[0]
    if cur and cur["n"] == count:
        cur["ops"].append(op)
        cur["st"] += samples
    else:
        cur = {"a": addr - base, "n": count, "ops": [op], "st": samples}
        blocks.append(cur)
least = float(sys.argv[2]) if len(sys.argv) > 2 else 0.002
for b in blocks:
    dyn = b["n"] * len(b["ops"])
    if dyn / total < least:
        continue
    runs = []
    for op in b["ops"]:
        if runs and runs[-1][0] == op:
            runs[-1][1] += 1
        else:
            runs.append([op, 1])
    text = " ".join(o if c == 1 else f"{o}x{c}" for o, c in runs)
    print(
        f"{b['a']:#7x} n={b['n']:>8} len={len(b['ops']):>4} dyn={100 * dyn / total:5.1f}% "
        f"stall={100 * b['st'] / stalls:5.1f}%  {text[:300]}"
    )
