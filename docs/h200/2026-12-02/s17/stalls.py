# Warp-stall breakdown per kernel from an ncu SASS source page exported as CSV (gzip), e.g.
# the sixteenth session's profile at 8192 causal tokens, head dim 128 (ours, then cuDNN's):
#     python3 docs/h200/2026-12-02/s17/stalls.py docs/h200/2026-12-02/s16/c/prefill-sass.csv.gz
# Prints each stall reason's share of all samples and the opcodes that collect most of it.
import collections
import csv
import gzip
import re
import sys

sections, cur = [], None
with gzip.open(sys.argv[1], "rt") as f:
    rows = list(csv.reader(f))
for row in rows:
    if row and row[0] == "Kernel Name":
        cur = {"name": row[1][:64], "hdr": None, "rows": []}
        sections.append(cur)
    elif cur is not None and cur["hdr"] is None:
        cur["hdr"] = row
    elif cur is not None:
        cur["rows"].append(row)
for sec in sections:
    ix = {h: i for i, h in enumerate(sec["hdr"])}
    reasons = [h for h in sec["hdr"] if h.startswith("stall_") and "Not Issued" not in h]
    total, by_op, samples = collections.Counter(), collections.defaultdict(collections.Counter), 0
    for row in sec["rows"]:
        try:
            n = int(row[ix["Warp Stall Sampling (All Samples)"]] or 0)
        except (ValueError, IndexError):
            continue
        op = re.sub(r"^@!?U?P\w+ ", "", row[ix["Source"]].strip()).split(" ")[0] or "(none)"
        samples += n
        for r in reasons:
            v = int(row[ix[r]] or 0)
            total[r] += v
            by_op[r][op] += v
    print(f"{sec['name']}: {samples} samples")
    for r, v in total.most_common(8):
        top = ", ".join(f"{op} {c}" for op, c in by_op[r].most_common(3))
        print(f"  {r:20s} {100 * v / samples:5.1f}%  ({top})")
