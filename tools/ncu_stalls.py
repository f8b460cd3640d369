"""Where a kernel's warps wait, from ncu's SASS table: the stall samples by reason and by
instruction kind, one kernel per column, so that two kernels' profiles compare side by side.

The input is what `ncu -i REPORT --page source --csv --print-source sass` prints (gzipped or
not): one row per SASS instruction with its sampled warp stalls (the `stall_*` columns count
samples whose warp was stalled for that reason at that instruction). Each column of the
output is the share of that kernel's samples, in percent, so kernels of different lengths
compare.

    python tools/ncu_stalls.py prefill=q-sass.csv two=q-two-sass.csv [--json out.json]
"""

from __future__ import annotations

import argparse
import csv
import gzip
import json
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # hopper_sass, beside this script
from hopper_sass import Instr, loops  # noqa: E402  (SASS instructions, backward branches)

# Instruction kinds by opcode prefix; the first that matches names the row.
KINDS = (
    ("wgmma", ("HGMMA", "WARPGROUP")),
    ("barrier wait", ("SYNCS", "BAR", "WARPSYNC")),
    ("async copy", ("LDGSTS", "LDGDEPBAR", "DEPBAR", "UTMALDG", "UBLKCP")),
    ("global load/store", ("LDG", "STG", "LD.", "ST.", "RED", "ATOM")),
    ("shared load/store", ("LDS", "STS", "LDSM", "STSM")),
    ("branch", ("BRA", "BSSY", "BSYNC", "EXIT", "RET", "CALL")),
    ("fence", ("FENCE", "MEMBAR", "CCTL", "ERRBAR")),
)


def kind(ins: Instr) -> str:
    """The kind of one instruction (`@P0 HGMMA.64x256x16...` -> wgmma)."""
    for name, prefixes in KINDS:
        if ins.mnemonic.startswith(prefixes):
            return name
    return "other"


def loop_bounds(ins: list[Instr]) -> tuple[int, int]:
    """The rows of the loop around the wgmma instructions: from the target of the backward
    branch that closes over them to that branch (the innermost such loop); without wgmma,
    or without a branch back over them, the whole table."""
    mma = [i.addr for i in ins if i.op == "HGMMA"]  # the MMAs themselves
    around = [(n, lo, hi) for lo, hi, n in loops(ins) if mma and lo <= mma[0] and hi >= mma[-1]]
    if not around:
        return 0, len(ins) - 1
    _, lo, hi = min(around)
    index = {i.addr: at for at, i in enumerate(ins)}
    return index[lo], index[hi]


def read(path: Path) -> tuple[Counter, Counter, int, Counter, Counter]:
    """Samples by stall reason, by instruction kind, their total, and by region of the code:
    before the loop around the wgmma instructions (set-up and the pipeline's fill), in it,
    and after it (the epilogue); and by opcode."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", newline="") as f:
        rows = list(csv.reader(f))
    start = next((i for i, r in enumerate(rows) if "Source" in r and "Address" in r), None)
    if start is None:
        raise SystemExit(f"ncu_stalls: {path}: no SASS table (no 'Address' and 'Source' header)")
    head = rows[start]
    src, total_col = head.index("Source"), head.index("Warp Stall Sampling (All Samples)")
    reasons = [(i, h) for i, h in enumerate(head) if h.startswith("stall_") and "(" not in h]
    body = [row for row in rows[start + 1 :] if len(row) == len(head)]
    addr = head.index("Address")
    ins = [Instr(int(row[addr], 16), row[src].strip()) for row in body]
    first, last = loop_bounds(ins)
    by_reason, by_kind, by_region, by_op, total = Counter(), Counter(), Counter(), Counter(), 0
    for at, (row, i) in enumerate(zip(body, ins, strict=True)):
        samples = int(row[total_col] or 0)
        total += samples
        by_kind[kind(i)] += samples
        by_op[i.op] += samples
        by_region["before the loop" if at < first else "loop" if at <= last else "after"] += samples
        for i, name in reasons:
            by_reason[name.removeprefix("stall_")] += int(row[i] or 0)
    if total == 0:
        raise SystemExit(f"ncu_stalls: {path}: no samples (was the report taken with --set full?)")
    return by_reason, by_kind, total, by_region, by_op


def table(named: dict[str, tuple], which: int, top: int) -> list[str]:
    """Rows of percentages for the by-reason (0), by-kind (1), by-region (3) or by-opcode (4)
    counters, largest first."""
    keys = Counter()
    for counters in named.values():
        for key, value in counters[which].items():
            keys[key] += value / counters[2]
    lines = [f"{'':22}" + "".join(f"{n:>12}" for n in named)]
    for key, _ in keys.most_common(top):
        cells = "".join(f"{100 * c[which][key] / c[2]:11.1f}%" for c in named.values())
        lines.append(f"{key:22}{cells}")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("tables", nargs="+", metavar="NAME=CSV", help="ncu SASS source tables")
    ap.add_argument("--top", type=int, default=10, help="rows per table (default 10)")
    ap.add_argument("--json", type=Path, help="write the counts here as well")
    args = ap.parse_args(argv)
    named = {}
    for item in args.tables:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            ap.error(f"{item!r}: expected NAME=CSV")
        if not Path(path).is_file():
            ap.error(f"{path}: no such file")
        named[name] = read(Path(path))
    print("stall samples by reason, % of each kernel's samples")
    print("\n".join(table(named, 0, args.top)))
    print("\nstall samples by instruction kind, % of each kernel's samples")
    print("\n".join(table(named, 1, args.top)))
    print("\nstall samples by region (the loop: the innermost one around every wgmma), %")
    print("\n".join(table(named, 3, 3)))
    print("\nstall samples by opcode, %")
    print("\n".join(table(named, 4, args.top)))
    print("\nsamples: " + ", ".join(f"{n} {c[2]}" for n, c in named.items()))
    if args.json:
        out = {
            n: {
                "reasons": dict(c[0]),
                "kinds": dict(c[1]),
                "regions": dict(c[3]),
                "opcodes": dict(c[4]),
                "samples": c[2],
            }
            for n, c in named.items()
        }
        args.json.write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
