"""Chained A/B of sliding-window attention in the form the engine and scorer give it: the
window folded into a bool mask by the windowed KV caches and noted on it (bi_rl._mask_window)
against the same mask unnoted (attention then learns the window from the mask alone), the
kernel's own window argument, and stock MLX's attention under the mask; decode rows (B rows
over a cache of keys) and causal prefill of one sequence, Qwen3-1.7B's heads (16 query / 8 KV,
head dim 128). The three ways of ours must give the same output bits (the keys a row attends
to are the same; only the work of finding them differs). Each side runs as a chain of calls
in one process, the sides alternating (bi_rl.bench.timing.compare_many); one JSON line a cell:
median ms a call, the ratios and the bits check.

    python tools/window_ab.py --window 4096 --decode 8x16384,8x32768 --prefill 2048,16384
"""

from __future__ import annotations

import argparse

import mlx.core as mx
import orjson

from bi_rl import _mask_window as mask_window
from bi_rl import _stock, ops
from bi_rl.backends.composed import window_mask
from bi_rl.bench.kernels import Chain, rand_rows
from bi_rl.bench.timing import compare_many
from bi_rl.verify.core import bits, rand

HEADS, KV_HEADS, D = 16, 8, 128


def cell(b: int, tq: int, tk: int, w: int) -> dict:
    q = rand((b, HEADS, tq, D), mx.bfloat16, 1)
    k, v = (rand_rows((b, KV_HEADS, tk, D), mx.bfloat16, s) for s in (2, 3))
    scale = D**-0.5
    noted, plain = window_mask(tq, tk, w), window_mask(tq, tk, w)
    mask_window.note(noted, w)
    causal = "causal" if tq > 1 else None
    sides = {
        "noted": lambda x: ops.scaled_dot_product_attention(x, k, v, scale, noted),
        "mask": lambda x: ops.scaled_dot_product_attention(x, k, v, scale, plain),
        "kernel_window": lambda x: ops.scaled_dot_product_attention(
            x, k, v, scale, causal, window=w
        ),
        "stock": lambda x: _stock.sdpa(x, k, v, scale, mask=plain),
    }
    outs = {n: sides[n](q) for n in ("noted", "mask", "kernel_window")}
    mx.eval(*outs.values())
    same = all(
        bool((bits(outs[n]) == bits(outs["noted"])).all()) for n in ("mask", "kernel_window")
    )
    res = compare_many({n: Chain(f, q) for n, f in sides.items()})
    ms = {n: r.median_s * 1e3 for n, r in res.items()}
    return {
        "B": b,
        "queries": tq,
        "keys": tk,
        "window": w,
        "same_bits": same,
        **ms,
        "noted/mask": ms["noted"] / ms["mask"],
        "noted/stock": ms["noted"] / ms["stock"],
        "mask/stock": ms["mask"] / ms["stock"],
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--window", type=int, default=4096, help="keys a row's window holds")
    ap.add_argument("--decode", default="8x16384", help="comma-separated BxKEYS decode cells")
    ap.add_argument("--prefill", default="2048,16384", help="comma-separated prefill tokens")
    args = ap.parse_args(argv)
    cells = [tuple(int(x) for x in c.split("x")) for c in args.decode.split(",") if c]
    for b, keys in cells:
        print(orjson.dumps(cell(b, 1, keys, args.window)).decode(), flush=True)
    for t in (int(x) for x in args.prefill.split(",") if x):
        print(orjson.dumps(cell(1, t, t, args.window)).decode(), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
