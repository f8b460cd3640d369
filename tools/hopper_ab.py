"""Several configurations of the Hopper GEMM timed against each other and stock MLX, in one
process, on bi-bench's bf16 GEMM shapes at the rows given.

    PYTHONPATH=. python tools/hopper_ab.py [--configs PREFILL,PREFILL_DEEP,128x2x3] \
        [--ms 512,4096,16384] [--rounds 9] [--only K,N ...] [--chain] > ab.jsonl

A configuration is `auto` (whatever the dispatcher picks for the cell, the few-row kernel
included), the name of one in bi_rl.backends.cuda.hopper (PREFILL, PREFILL_DEEP),
BNxNWGxSTAGES with an optional `d` for loads a stage further ahead (`128x2x3d`): BN columns,
NWG warpgroups of 64 rows, STAGES pipeline stages, or the few-row kernel's nNTxWARPSxSTAGES
(`n1x2x12`: NT chains a warp, WARPS warps, STAGES k-tiles in flight). Every configuration
gives the same bits (gemm.cu's opening comment says why), so the comparison is about speed
alone; each cell checks the bits against the first configuration anyway and reports
`same_bits`.

`--bits B` times the quantized GEMM instead (affine, `--group` columns a scale, weights
quantized by mx.quantize): a configuration is then `auto`, or BNxNWGxSTAGES with optional
`-rRT` (rows a block, the row tile) and `-kKT` (k-tiles a stage), as hopper_qmm.qconfig
builds it (`16x1x6-r64`, `64x1x6-r32-k2`), the few-row kernel nNTxWARPSxSTAGES (`n1x2x12`)
or its warp-specialised form wsNTxWARPSxSTAGESxHELPERS[xSLOTS] (`ws1x2x16x4`, four slots
unless given: `ws1x2x32x8x8`), and stock is mx.quantized_matmul.

The sides are timed by bi_rl.bench.timing.compare_many: a sample of each side a round, the
order rotated every round, a sample being `inner` calls evaluated together (inner sized so
that every side's sample takes at least 20 ms); the figure is the median over rounds. Weights
are rotated over copies past the L2 cache as in bi-bench. With `--chain` every side is a
bi_rl.bench.kernels.Chain: each call's input depends on the previous call's output through one
small elementwise kernel on every side, so calls cannot overlap on the GPU as the independent
calls of a sample may (MLX orders a sample's kernels by their data alone): the latency a
model's chain of layers sees, which favours blocks that fill the multiprocessors; the link's
time is in every side's figure. One JSON line a cell: each side's
milliseconds and spread, each configuration over the first and over stock. The dispatcher
never picks a configuration because this tool timed it: a new default is a change to
`choose_config` with its own GPU-test run. Needs a Hopper GPU with NVRTC.
"""

from __future__ import annotations

import argparse
import itertools
import re
import sys

import mlx.core as mx
import orjson

DEFAULT_CONFIGS = "PREFILL,PREFILL_DEEP,128x2x3,128x2x3d"
DEFAULT_MS = "512,4096,16384"
DEFAULT_ROUNDS = 9
_SHAPE = re.compile(r"^(\d+)x([12])x(\d+)(d?)$")
_QSHAPE = re.compile(r"^(\d+)x([12])x(\d+)(?:-r(\d+))?(?:-k(\d+))?$")
# the few-row kernels: nNTxWARPSxSTAGES, the warp-specialised one wsNTxWARPSxSTAGESxHELPERS[xSLOTS]
_QNARROW = re.compile(r"^n(\d+)x(\d+)x(\d+)$")
_QWS = re.compile(r"^ws(\d+)x(\d+)x(\d+)x(\d+)(?:x(\d+))?$")


def _fitting(cfg, text: str):
    """cfg, or ValueError naming `text` where it needs more shared memory than a block has."""
    from bi_rl.backends.cuda import hopper

    if cfg.shared_memory > hopper.MAX_SHARED:
        raise ValueError(f"configuration {text!r} needs {cfg.shared_memory} bytes of shared memory")
    return cfg


def parse_qconfig(text: str, bits: int):
    """A QmmConfig from BNxNWGxSTAGES[-rRT][-kKT] for `bits` (or a few-row one, nNTxWARPSxSTAGES
    or wsNTxWARPSxSTAGESxHELPERS[xSLOTS]), None for `auto`; ValueError
    naming the text otherwise (a shape the kernel refuses, or one past the shared memory)."""
    from bi_rl.backends.cuda import hopper_qmm

    if text == "auto":
        return None
    if m := _QNARROW.match(text):
        return _fitting(hopper_qmm.QNarrowConfig(*map(int, m.groups()), bits=bits), text)
    if m := _QWS.match(text):
        nt, warps, stages, helpers = map(int, m.groups()[:4])
        slots = int(m[5] or 4)
        cfg = hopper_qmm.QNarrowWsConfig(nt, warps, stages, bits=bits, helpers=helpers, slots=slots)
        return _fitting(cfg, text)
    m = _QSHAPE.match(text)
    if m is None:
        raise ValueError(
            f"quantized configuration {text!r}: expected auto, BNxNWGxSTAGES with optional "
            "-rRT and -kKT (16x1x6-r64), nNTxWARPSxSTAGES (the few-row kernel, n1x2x12) or "
            "wsNTxWARPSxSTAGESxHELPERS[xSLOTS] (its warp-specialised form, ws1x2x16x4)"
        )
    bn, nwg, stages = int(m[1]), int(m[2]), int(m[3])
    rt, kt = int(m[4] or 0), int(m[5] or 1)
    return _fitting(hopper_qmm.qconfig(bn, nwg, bits, rt, kt, stages), text)


def parse_config(text: str):
    """A HopperConfig from a name in hopper (PREFILL) or BNxNWGxSTAGES[d], None for `auto`
    (the dispatcher's pick); ValueError naming the text otherwise."""
    from bi_rl.backends.cuda import hopper

    if text == "auto":
        return None

    named = getattr(hopper, text, None)
    if isinstance(named, hopper.HopperConfig):
        return named
    if m := _QNARROW.match(text):
        return _fitting(hopper.NarrowConfig(*map(int, m.groups())), text)
    m = _SHAPE.match(text)
    if m is None:
        raise ValueError(
            f"configuration {text!r}: expected auto, a name in hopper (PREFILL, PREFILL_DEEP), "
            "BNxNWGxSTAGES with an optional d (128x2x3d) or the few-row kernel's "
            "nNTxWARPSxSTAGES (n1x2x12)"
        )
    bn, nwg, stages, deep = int(m[1]), int(m[2]), int(m[3]), m[4] == "d"
    return _fitting(hopper.HopperConfig(bn, nwg, stages, deep=deep), text)


def setup_arg_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--configs", default=DEFAULT_CONFIGS, help="comma-separated; the first is the base"
    )
    p.add_argument("--ms", default=DEFAULT_MS, help="rows (M) to time, comma-separated")
    p.add_argument("--rounds", type=int, default=DEFAULT_ROUNDS)
    p.add_argument(
        "--only",
        action="append",
        default=None,
        help="a weight shape K,N; repeat for more (default: all of bi-bench's)",
    )
    p.add_argument("--bits", type=int, default=0, help="time the quantized GEMM at this width")
    p.add_argument("--group", type=int, default=64, help="columns a scale (with --bits)")
    p.add_argument("--chain", action="store_true", help="each call waits for the last (see above)")
    return p


def main(argv=None) -> int:
    args = setup_arg_parser().parse_args(argv)
    try:
        if args.bits:
            from bi_rl.backends.cuda import hopper_qmm

            if args.bits not in hopper_qmm.BITS:
                raise ValueError(f"--bits {args.bits}: the kernel takes {hopper_qmm.BITS}")
            configs = {c: parse_qconfig(c, args.bits) for c in args.configs.split(",")}
        else:
            configs = {c: parse_config(c) for c in args.configs.split(",")}
        ms = [int(m) for m in args.ms.split(",")]
        only = [tuple(int(v) for v in s.split(",")) for s in args.only or ()]
        if any(len(s) != 2 for s in only):
            raise ValueError(f"--only takes K,N, got {args.only}")
    except ValueError as e:
        print(f"hopper_ab: {e}", file=sys.stderr)
        return 2
    from bi_rl import _stock
    from bi_rl.backends.cuda import hopper
    from bi_rl.bench.kernels import GEMM_SHAPES, Chain, _copies
    from bi_rl.bench.timing import compare_many
    from bi_rl.verify.core import bits, rand

    if not hopper.available():
        print(
            "hopper_ab: needs a Hopper GPU with NVRTC (hopper.available() is false)",
            file=sys.stderr,
        )
        return 2
    base = next(iter(configs))
    bf16 = mx.bfloat16
    if args.bits:
        from bi_rl.backends.cuda import hopper_qmm

        g, b = args.group, args.bits

        def ours(x, w, cfg):
            return hopper_qmm.quantized_matmul(x, *w, g, b, config=cfg)

        def stock(x, w):
            return _stock.quantized_matmul(x, *w, True, g, b, "affine")

        def weights(n, k):
            count = _copies(n * k * b // 8, False)
            ws = [rand((n, k), bf16, 1 + i, scale=k**-0.5) for i in range(count)]
            return [tuple(mx.quantize(w, group_size=g, bits=b)) for w in ws]
    else:

        def ours(x, w, cfg):
            return hopper.gemm(x, w, b_kn=False, config=cfg)

        def stock(x, w):
            return _stock.linear(x, w)

        def weights(n, k):
            count = _copies(n * k * 2, False)
            return [rand((n, k), bf16, 1 + i, scale=k**-0.5) for i in range(count)]

    for k, n in only or GEMM_SHAPES:
        ws = weights(n, k)
        mx.eval(ws)
        for m in ms:
            if m == 16384 and n > 100_000:
                continue  # bi-bench's table skips it too: 5 GB of logits
            x = rand((m, k), bf16, 2 + m)
            mx.eval(x)
            nxt = itertools.cycle(ws).__next__

            def side(fn, x=x):
                """fn on x, or with --chain on x linked to fn's last output."""
                return Chain(fn, x) if args.chain else lambda: fn(x)

            sides = {
                name: side(lambda v, w=nxt, c=cfg: ours(v, w(), c)) for name, cfg in configs.items()
            }
            sides["stock"] = side(lambda v, w=nxt: stock(v, w()))
            ref = bits(ours(x, ws[0], configs[base]))
            same = all(
                (bits(ours(x, ws[0], cfg)) == ref).all()
                for name, cfg in configs.items()
                if name != base
            )
            timed = compare_many(sides, samples=args.rounds)
            med = {name: t.median_s for name, t in timed.items()}
            row = {"cell": f"M={m} K={k} N={n}", "bits": args.bits, "same_bits": bool(same)}
            row["chain"] = args.chain
            row["inner"] = timed[base].inner
            for name in sides:
                row[f"{name}_ms"] = round(med[name] * 1e3, 4)
                row[f"{name}_spread"] = round(timed[name].spread, 3)
            for name in configs:
                row[f"{name}_over_{base}"] = round(med[name] / med[base], 3)
                row[f"{name}_over_stock"] = round(med[name] / med["stock"], 3)
            print(orjson.dumps(row).decode(), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
