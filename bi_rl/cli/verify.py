"""bi-verify: prove the mode batch-invariant on this machine, and test stock MLX as a control.

    bi-verify --quick            # under a minute on a 2-core CPU
    bi-verify --json report.json # the full sweep, with every check's numbers saved

Every check compares raw bit patterns of rows computed alone with the same rows computed in
company (bigger batches, reversed batches, left padding, grown caches, decode vs prefill
chunks). The mode's sweep must find zero differing bits: any difference, or a case the
backend refuses in strict mode, exits 1. The same sweep over stock MLX is reported
separately: where stock is invariant too (MLX's CPU backend) that is a finding, not a failure.
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict

import mlx.core as mx
import orjson

from bi_rl import __version__, backends, verify
from bi_rl._source import source_digest
from bi_rl.backends import device_name


def setup_arg_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="bi-verify",
        description="Sweep GEMM, quantized GEMM and attention for batch invariance on this "
        "machine: the bi-rl mode must show zero differing bits; stock MLX is the control.",
    )
    p.add_argument("--quick", action="store_true", help="the small sweep (CI: under a minute)")
    p.add_argument("--json", metavar="PATH", help="write every check as JSON ('-' for stdout)")
    p.add_argument(
        "--only", choices=["gemm", "quantized", "attention"], help="run one family of checks"
    )
    p.add_argument("--no-control", action="store_true", help="skip the stock MLX control sweep")
    p.add_argument(
        "--large",
        action="store_true",
        help="add model-sized GEMMs (K, N) = (896, 4864), (4864, 896) to the full sweep "
        "(default on GPU backends; minutes on a CPU)",
    )
    p.add_argument("-v", "--verbose", action="store_true", help="print each check as it runs")
    return p


def summarize(checks) -> list[dict]:
    groups = defaultdict(lambda: {"checks": 0, "compared": 0, "differing": 0, "statuses": set()})
    for c in checks:
        g = groups[(c.family, c.dtype)]
        g["checks"] += 1
        g["compared"] += c.compared
        g["differing"] += c.differing
        g["statuses"].add(c.status)
    rows = []
    for (family, dtype), g in groups.items():
        statuses = g["statuses"]
        worst = next(s for s in ("error", "unsupported", "variant", "ok") if s in statuses)
        rows.append({"family": family, "dtype": dtype, **g, "result": worst, "statuses": None})
    return rows


RESULT_WORDS = {"ok": "invariant", "variant": "VARIANT", "unsupported": "REFUSED", "error": "ERROR"}


def table(title: str, checks) -> str:
    lines = [
        title,
        f"  {'family':<10} {'dtype':<9} {'checks':>6} {'compared':>11} {'differing':>10}  result",
    ]
    for r in summarize(checks):
        lines.append(
            f"  {r['family']:<10} {r['dtype']:<9} {r['checks']:>6} {r['compared']:>11,} "
            f"{r['differing']:>10,}  {RESULT_WORDS[r['result']]}"
        )
    for c in checks:
        if c.status != "ok":
            lines.append(f"    {c.status}: {c.case} [{c.dtype}]: {'; '.join(c.where) or c.detail}")
    return "\n".join(lines)


def main(argv=None) -> int:
    args = setup_arg_parser().parse_args(argv)
    backend = backends.active()
    say = lambda s: print(s, file=sys.stderr, flush=True)
    header = (
        f"bi-verify {__version__}: backend {backend.name} ({device_name()}), mlx {mx.__version__}, "
        f"{'quick' if args.quick else 'full'} sweep, source {source_digest()}"
    )
    print(header, flush=True)
    for op, how in backend.how.items():
        print(f"  {op}: {how}")

    def sweep(ops):
        return verify.run(
            ops,
            args.quick,
            progress=say if args.verbose else None,
            only=args.only,
            large=args.large or backend.name != "cpu",
        )

    mode = sweep(verify.MODE)
    stock = [] if args.no_control else sweep(verify.STOCK)
    print()
    print(table("bi-rl mode (strict)", mode))
    if stock:
        print()
        print(table("stock MLX (control)", stock))

    mode_bad = [c for c in mode if c.status != "ok"]
    compared = sum(c.compared for c in mode)
    print()
    if mode_bad:
        print(
            f"FAIL: the mode is not invariant here: {len(mode_bad)} of {len(mode)} checks failed."
        )
    else:
        print(
            f"PASS: the mode is batch-invariant: 0 of {compared:,} elements differ "
            f"in {len(mode)} checks."
        )
    if stock:
        stock_variant = [c for c in stock if c.status == "variant"]
        n_diff = sum(c.differing for c in stock_variant)
        if stock_variant:
            print(
                f"Control: stock MLX is batch-variant on the {backend.name} backend: {n_diff:,} "
                f"elements differ in {len(stock_variant)} of {len(stock)} checks."
            )
        else:
            print(
                f"Finding: stock MLX was itself batch-invariant on the {backend.name} backend in "
                f"all {len(stock)} checks (not a failure: here the mode costs nothing and proves "
                "the same bits)."
            )
    if args.json:
        report = {
            "bi_rl": __version__,
            "source": source_digest(),
            "mlx": mx.__version__,
            "backend": backend.name,
            "device": device_name(),
            "sweep": "quick" if args.quick else "full",
            "passed": not mode_bad,
            "mode": [c.as_dict() for c in mode],
            "stock": [c.as_dict() for c in stock],
        }
        data = orjson.dumps(report, option=orjson.OPT_INDENT_2)
        if args.json == "-":
            sys.stdout.buffer.write(data + b"\n")
        else:
            with open(args.json, "wb") as f:
                f.write(data)
    return 1 if mode_bad else 0


if __name__ == "__main__":
    sys.exit(main())
