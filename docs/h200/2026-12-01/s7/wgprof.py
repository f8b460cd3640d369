"""Time wgmma prefill (nwg 1, 2) against the mma.sync kernel and stock, then one launch each under ncu."""

import sys, time
import mlx.core as mx
from bi_rl import _stock
from bi_rl.backends.cuda import attention as A, hopper_attention as H
from bi_rl.verify.core import rand

BF16 = mx.bfloat16
SEQ = A.AttnConfig(4, 2, False) if hasattr(A, "AttnConfig") else None


def t(fn, n=10):
    mx.eval(fn())
    mx.synchronize()
    ts = []
    for _ in range(n):
        s = time.perf_counter()
        mx.eval(fn())
        mx.synchronize()
        ts.append(time.perf_counter() - s)
    ts.sort()
    return ts[len(ts) // 2] * 1e3


prof = len(sys.argv) > 1
cases = (
    [(16, 8, 128, 8192), (32, 8, 64, 8192)]
    if prof
    else [(16, 8, 128, n) for n in (2048, 8192)] + [(32, 8, 64, n) for n in (2048, 8192)]
)


def make(q, k, v, sc):
    return {
        "wg1": lambda: H.launch(q, k, v, sc, None, 1, 0, nwg=1),
        "wg2": lambda: H.launch(q, k, v, sc, None, 1, 0, nwg=2),
        "mma": lambda: A.scaled_dot_product_attention(q, k, v, sc, "causal"),
        "stock": lambda: _stock.scaled_dot_product_attention(q, k, v, scale=sc, mask="causal"),
    }


made = []
for hq, hk, d, n in cases:
    q, k, v = (
        rand((1, hq, n, d), BF16, 4),
        rand((1, hk, n, d), BF16, 5),
        rand((1, hk, n, d), BF16, 6),
    )
    mx.eval(q, k, v)
    sc = d**-0.5
    fns = make(q, k, v, sc)
    if 0:
        {
            "wg1": lambda: H.launch(q, k, v, sc, None, 1, 0, nwg=1),
            "wg2": lambda: H.launch(q, k, v, sc, None, 1, 0, nwg=2),
            "mma": lambda: A.scaled_dot_product_attention(q, k, v, sc, "causal"),
            "stock": lambda: _stock.scaled_dot_product_attention(q, k, v, scale=sc, mask="causal"),
        }
    if not prof:
        r = {kk: t(f) for kk, f in fns.items()}
        fl = 4 * n * n / 2 * d * hq
        print(
            f"hq{hq} d{d} n{n}: "
            + "  ".join(f"{kk} {vv:.3f} ms ({fl / vv / 1e9:.0f} TF/s)" for kk, vv in r.items()),
            flush=True,
        )
    else:
        for f in fns.values():
            mx.eval(f())
        made.append(fns)
if prof:
    from cuda.bindings import runtime

    mx.synchronize()
    runtime.cudaProfilerStart()
    for fns in made:
        for kk in ("wg1", "wg2", "stock"):
            mx.eval(fns[kk]())
            mx.synchronize()
    runtime.cudaProfilerStop()
