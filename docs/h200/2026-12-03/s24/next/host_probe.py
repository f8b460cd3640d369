"""Where a small invariant call's time goes: graph building on the host, the launches, the GPU.

`bench.timing.compare` builds `inner` calls' graphs, then evaluates them all and synchronises:
a call's time is (graph building) + max(launching, GPU work), the building never overlapped
with the GPU. This script times, per call and beside stock MLX in one process:

- build: the graphs alone (no evaluation), medians of 15 samples of `inner` calls;
- total: compare()'s figure (building, launching and running);
- and for split-mode decode attention the forward kernel alone and the combine kernel alone
  (on partials computed ahead), so the combine's share of the total is measured, not
  inferred from ncu's kernel time.

Cells: decode attention with Qwen3-1.7B heads (16 query / 8 KV, head dim 128) at B = 1 over
8192 and 32768 keys and B = 8 over 32768, and the 4-bit group-64 quantized matmul at M = 1 over
(K, N) = (2048, 2048) and (4096, 14336). One JSON line a cell:

    PYTHONPATH=<tree> python3 -P docs/h200/2026-12-03/s24/next/host_probe.py > host.jsonl
"""

from __future__ import annotations

import statistics
import time

import mlx.core as mx
import orjson

from bi_rl import _stock
from bi_rl.backends.cuda import attention as A
from bi_rl.backends.cuda import hopper_qmm as Q
from bi_rl.bench.kernels import rand_rows
from bi_rl.bench.timing import compare
from bi_rl.verify.core import rand

BF16 = mx.bfloat16
INNER = 64


def build_us(fn) -> float:
    """Median microseconds to build one call's graph (nothing evaluated)."""
    fn()  # plans and kernels cached
    samples = []
    for _ in range(15):
        start = time.perf_counter()
        outs = [fn() for _ in range(INNER)]
        samples.append((time.perf_counter() - start) / INNER)
        del outs
    return statistics.median(samples) * 1e6


def row(cell: str, fns: dict) -> None:
    out = {"cell": cell}
    for name, fn in fns.items():
        out[f"{name}_build_us"] = round(build_us(fn), 2)
    names = list(fns)
    for name in names[:-1]:
        t_a, t_s = compare(fns[name], fns[names[-1]])
        out[f"{name}_total_us"] = round(t_a.median_s * 1e6, 2)
        out[f"stock_total_us_vs_{name}"] = round(t_s.median_s * 1e6, 2)
        out[f"{name}_spread"] = round(max(t_a.spread, t_s.spread), 3)
    print(orjson.dumps(out).decode(), flush=True)


def attention_cells() -> None:
    scale = 128**-0.5
    for b, keys in ((1, 8192), (1, 32768), (8, 32768)):
        q = rand((b, 16, 1, 128), BF16, 1)
        k, v = rand_rows((b, 8, keys, 128), BF16, 2), rand_rows((b, 8, keys, 128), BF16, 3)
        mx.eval(q, k, v)
        fwd, combine = A._plan(q, k, v, scale, None, None, None, None, False)
        fns = {"ours": lambda q=q, k=k, v=v: A.scaled_dot_product_attention(q, k, v, scale, None)}
        if combine is not None:
            part = fwd(q, k, v)
            mx.eval(part)
            fns["fwd"] = lambda q=q, k=k, v=v, fwd=fwd: fwd(q, k, v)
            fns["combine"] = lambda part=part, q=q, combine=combine: combine(part, q)
        fns["stock"] = lambda q=q, k=k, v=v: _stock.scaled_dot_product_attention(
            q, k, v, scale=scale
        )
        row(f"attention b={b} keys={keys} split={combine is not None}", fns)
        del q, k, v


def qmm_cells() -> None:
    for k, n in ((2048, 2048), (4096, 14336)):
        wq, sc, bi = mx.quantize(rand((n, k), BF16, 3, k**-0.5), group_size=64, bits=4)
        x = rand((1, k), BF16, 4)
        mx.eval(wq, sc, bi, x)
        fns = {
            "ours": lambda x=x, wq=wq, sc=sc, bi=bi: Q.quantized_matmul(x, wq, sc, bi, 64, 4),
            "stock": lambda x=x, wq=wq, sc=sc, bi=bi: mx.quantized_matmul(
                x, wq, sc, bi, True, 64, 4
            ),
        }
        row(f"qmm 4-bit M=1 K={k} N={n}", fns)


if __name__ == "__main__":
    attention_cells()
    qmm_cells()
