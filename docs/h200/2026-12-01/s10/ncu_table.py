"""The GPU time table of run 8 from its ncu CSV: python ncu_table.py run8/narrow-ncu.csv.gz"""

import csv
import gzip
import io
import re
import sys
from collections import defaultdict

with gzip.open(sys.argv[1], "rt") as f:
    text = f.read().splitlines()
labels = {}
for line in text:
    m = re.match(r"^(\d+) (M=.*)$", line)
    if m:
        labels[int(m.group(1))] = m.group(2)
rows = list(csv.reader(io.StringIO("\n".join(x for x in text if x.startswith('"')))))[1:]
case, acc, out = 1, 0.0, {}
for r in rows:
    name, ns = r[4], float(r[-1].replace(",", ""))
    if "arange" in name:
        out[labels[case]] = acc
        case += 1
        acc = 0.0
    else:
        acc += ns
table = defaultdict(dict)
for lab, ns in out.items():
    shape, cfg = lab.rsplit(" ", 1)
    table[shape][cfg] = ns / 1e3
cfgs = ["stock", "wgmma", "16x2x12", "32x4x8", "64x4x6", "128x4x4"]
cfgs += sorted({c for d in table.values() for c in d} - set(cfgs))  # e.g. 16x2x6k2
print("case".ljust(24), *[c.rjust(9) for c in cfgs], "  (us, one launch, cold L2; ratio to stock)")
for shape, d in table.items():
    s = d["stock"]
    print(
        shape.ljust(24),
        *[
            (f"{d[c]:6.1f}" + f"({d[c] / s:.2f})" if c in d else "       -")
            if c != "stock"
            else f"{s:9.1f}"
            for c in cfgs
        ],
    )
