# Instruction mix of each kernel in an Nsight Compute SASS source page exported as CSV
# (`ncu -i REPORT --page source --print-source sass --csv`, here c/prefill-sass.csv.gz): warp
# instructions executed by opcode with their stall samples, the kernel's stall reasons, and
# instructions grouped by how often each executed (a loop's body shares one count, so the
# largest groups are the hot loop and how many instructions a pass of it runs).
#     python3 docs/h200/2026-12-02/s16/sass_mix.py docs/h200/2026-12-02/s16/c/prefill-sass.csv.gz
import collections
import csv
import gzip
import sys


def kernels(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", newline="") as f:
        cur = None
        for row in csv.reader(f):
            if row and row[0] == "Kernel Name":
                cur = {"name": row[1], "rows": []}
                yield cur
            elif row and row[0] == "Address":
                cur["header"] = row
            elif cur is not None and len(row) > 5:
                cur["rows"].append(row)


def number(s: str) -> int:
    try:
        return int(s.replace(",", "") or 0)
    except ValueError:
        return 0


for k in list(kernels(sys.argv[1])):  # each filled in as the file is read
    h = k["header"]
    ie, src = h.index("Instructions Executed"), h.index("Source")
    samples = h.index("Warp Stall Sampling (All Samples)")
    stall_cols = [i for i, c in enumerate(h) if c.startswith("stall_")]
    by_op, samples_op, stalls, groups = (collections.Counter() for _ in range(4))
    total = 0
    for r in k["rows"]:
        n = number(r[ie])
        words = r[src].split()
        op = (words[1] if words and words[0].startswith("@") else words[0]) if words else "?"
        base = op.split(".")[0]
        total += n
        by_op[base] += n
        samples_op[base] += number(r[samples])
        groups[n] += 1
        for i in stall_cols:
            stalls[h[i]] += number(r[i])
    print(f"{k['name'][:100]}\n  warp instructions executed: {total:,}")
    for op, n in by_op.most_common(24):
        print(
            f"  {op:12s} {n / 1e6:8.2f} M {100 * n / total:5.1f} %  stall samples {samples_op[op]}"
        )
    st = sum(stalls.values()) or 1
    print(
        "  stalls: " + ", ".join(f"{s[6:]} {100 * v / st:.1f} %" for s, v in stalls.most_common(8))
    )
    print("  instructions by execution count (count: instructions, share of all executed):")
    for n, c in sorted(groups.items(), key=lambda t: -t[0] * t[1])[:6]:
        print(f"    {n:>9,}: {c:5d} instructions, {100 * n * c / total:5.1f} %")
