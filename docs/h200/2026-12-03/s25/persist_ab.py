"""Persistent 128 x 256 blocks (PREFILL_PERSIST) against one block a tile (PREFILL) and stock
MLX, in one process, on the bf16 GEMM shapes of bi-bench past 64 rows.

Each round times the three sides one after another (order rotated every round), a sample
being `inner` calls evaluated together; the figure is the median over rounds. Weights are
rotated over copies past the L2 cache as in bi-bench. Prints one JSON line a cell:
persist / plain (the change's effect), and each over stock.

    PYTHONPATH=<tree> python3 -P docs/h200/2026-12-03/s25/persist_ab.py > persist.jsonl

(PREFILL_PERSIST lives in next/persist.patch; deep_ab.py runs the same comparison for
PREFILL_DEEP through main(side, config).)
"""

from __future__ import annotations

import itertools
import statistics
import time

import mlx.core as mx
import orjson

from bi_rl import _stock
from bi_rl.backends.cuda import hopper
from bi_rl.bench.kernels import GEMM_SHAPES, _copies
from bi_rl.verify.core import bits, rand

ROUNDS = 9


def sample(fn, inner: int) -> float:
    start = time.perf_counter()
    mx.eval([fn() for _ in range(inner)])
    mx.synchronize()
    return (time.perf_counter() - start) / inner


def main(side: str = "persist", config: str = "PREFILL_PERSIST") -> None:
    """Time hopper.<config> as `side` against PREFILL ("plain") and stock."""
    bf16 = mx.bfloat16
    for k, n in GEMM_SHAPES:
        ws = [rand((n, k), bf16, 1 + i, scale=k**-0.5) for i in range(_copies(n * k * 2, False))]
        mx.eval(ws)
        for m in (512, 4096, 16384):
            if m == 16384 and n > 100_000:
                continue
            x = rand((m, k), bf16, 2 + m)
            mx.eval(x)
            nxt = itertools.cycle(ws).__next__
            p, q = hopper.PREFILL, getattr(hopper, config)
            sides = {
                "plain": lambda x=x, w=nxt, c=p: hopper.gemm(x, w(), b_kn=False, config=c),
                side: lambda x=x, w=nxt, c=q: hopper.gemm(x, w(), b_kn=False, config=c),
                "stock": lambda x=x, w=nxt: _stock.linear(x, w()),
            }
            w0 = ws[0]
            same = (
                bits(hopper.gemm(x, w0, b_kn=False, config=q))
                == bits(hopper.gemm(x, w0, b_kn=False, config=hopper.PREFILL))
            ).all()
            one = sample(sides["stock"], 1)
            inner = max(2, min(64, int(0.02 / max(one, 1e-6))))
            for fn in sides.values():
                sample(fn, inner)
            times = {s: [] for s in sides}
            names = list(sides)
            for r in range(ROUNDS):
                for s in names[r % 3 :] + names[: r % 3]:
                    times[s].append(sample(sides[s], inner))
            med = {s: statistics.median(v) for s, v in times.items()}
            row = {
                "cell": f"M={m} K={k} N={n}",
                "plain_ms": round(med["plain"] * 1e3, 4),
                f"{side}_ms": round(med[side] * 1e3, 4),
                "stock_ms": round(med["stock"] * 1e3, 4),
                f"{side}_over_plain": round(med[side] / med["plain"], 3),
                "plain_over_stock": round(med["plain"] / med["stock"], 3),
                f"{side}_over_stock": round(med[side] / med["stock"], 3),
                "same_bits": bool(same),
                "inner": inner,
            }
            print(orjson.dumps(row).decode(), flush=True)


if __name__ == "__main__":
    main()
