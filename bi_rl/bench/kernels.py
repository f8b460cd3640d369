"""Kernel benchmarks: each invariant op beside stock MLX on the same inputs, same run.

Cases (the H200 profile; `quick` shrinks them for a CPU): bf16 GEMM in the nn.Linear layout
for (K, N) = (4096, 4096), (896, 4864), (4864, 896), (896, 151936) at M = 1, 8, 64, 256,
4096; 4-bit quantized GEMM (group 64) at M = 1, 8, 64; decode attention (one query token,
Qwen2-0.5B heads: 14 query / 2 KV, head dim 64) at 512..32768 keys and batch 1..64; causal
prefill attention at 512..8192 tokens. Each row also gives both sides' relative error
against a float64 reference where that is cheap (GEMM at M <= 64).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import mlx.core as mx
import numpy as np

from bi_rl import _stock, ops
from bi_rl.bench.timing import compare
from bi_rl.verify.core import rand

BF16 = mx.bfloat16
GEMM_SHAPES = ((4096, 4096), (896, 4864), (4864, 896), (896, 151936))


@dataclass
class Case:
    family: str
    label: str
    ours: Callable[[], mx.array]
    stock: Callable[[], mx.array]
    reference: Callable[[], np.ndarray] | None = None  # float64 result, when cheap
    target: float | None = None  # the project's ceiling for ours / stock (BENCHMARK.md)


def _f64(x: mx.array) -> np.ndarray:
    return np.array(x.astype(mx.float32), dtype=np.float64)


def gemm_cases(quick: bool) -> Iterator[Case]:
    shapes = ((896, 896), (896, 4864)) if quick else GEMM_SHAPES
    ms = (1, 8, 64) if quick else (1, 8, 64, 256, 4096)
    for k, n in shapes:
        w = rand((n, k), BF16, 1, scale=k**-0.5)
        for m in ms:
            x = rand((m, k), BF16, 2 + m)
            ref = (lambda x=x, w=w: _f64(x) @ _f64(w).T) if m <= 64 else None
            yield Case(
                "gemm bf16",
                f"M={m} K={k} N={n}",
                lambda x=x, w=w: ops.linear(x, w),
                lambda x=x, w=w: _stock.linear(x, w),
                ref,
                1.3 if m <= 64 else 1.5 if m == 4096 else None,
            )


def qmm_cases(quick: bool) -> Iterator[Case]:
    shapes = ((896, 896),) if quick else GEMM_SHAPES
    for k, n in shapes:
        wq, scales, biases = mx.quantize(
            rand((n, k), BF16, 3, scale=k**-0.5), group_size=64, bits=4
        )
        w_deq = mx.dequantize(wq, scales, biases, group_size=64, bits=4)
        for m in (1, 8, 64):
            x = rand((m, k), BF16, 4 + m)
            args = (wq, scales, biases, True, 64, 4, "affine")
            yield Case(
                "qmm 4-bit g64",
                f"M={m} K={k} N={n}",
                lambda x=x, a=args: ops.quantized_matmul(x, *a),
                lambda x=x, a=args: _stock.quantized_matmul(x, *a),
                lambda x=x, w=w_deq: _f64(x) @ _f64(w).T,
                1.5,
            )


def _attention(q, k, v, mask, ours: bool):
    scale = q.shape[-1] ** -0.5
    if ours:
        return ops.scaled_dot_product_attention(q, k, v, scale, mask)
    return _stock.scaled_dot_product_attention(q, k, v, scale=scale, mask=mask)


def attention_cases(quick: bool) -> Iterator[Case]:
    contexts = (512, 2048) if quick else (512, 2048, 8192, 32768)
    batches = (1, 8) if quick else (1, 8, 32, 64)
    hq, hkv, d = 14, 2, 64
    for ctx in contexts:
        for b in batches:
            q = rand((b, hq, 1, d), BF16, 5)
            k, v = rand((b, hkv, ctx, d), BF16, 6), rand((b, hkv, ctx, d), BF16, 7)
            yield Case(
                "attention decode bf16",
                f"B={b} keys={ctx}",
                lambda q=q, k=k, v=v: _attention(q, k, v, None, True),
                lambda q=q, k=k, v=v: _attention(q, k, v, None, False),
                target=1.25,
            )
    for t in (256, 512) if quick else (512, 2048, 8192):
        q, k, v = (rand((1, hq if i == 0 else hkv, t, d), BF16, 8 + i) for i in range(3))
        yield Case(
            "attention prefill bf16",
            f"B=1 tokens={t} causal",
            lambda q=q, k=k, v=v: _attention(q, k, v, "causal", True),
            lambda q=q, k=k, v=v: _attention(q, k, v, "causal", False),
            target=2.0,
        )


def _relerr(out: mx.array, ref: np.ndarray) -> float:
    return float(np.linalg.norm(_f64(out) - ref) / np.linalg.norm(ref))


def run(quick: bool, progress: Callable[[str], None] | None = None) -> list[dict]:
    rows = []
    samples = 7 if quick else 15
    for case in (*gemm_cases(quick), *qmm_cases(quick), *attention_cases(quick)):
        row = {"family": case.family, "case": case.label, "target": case.target}
        try:
            ours, stock = compare(case.ours, case.stock, samples=samples)
        except NotImplementedError as e:
            row.update(status="refused", detail=str(e))
        else:
            row.update(
                status="ok",
                ours_ms=ours.median_s * 1e3,
                stock_ms=stock.median_s * 1e3,
                ratio=ours.median_s / stock.median_s,
                spread=max(ours.spread, stock.spread),
                inner=ours.inner,
            )
            if case.reference is not None:
                ref = case.reference()
                row.update(ours_err=_relerr(case.ours(), ref), stock_err=_relerr(case.stock(), ref))
        mx.clear_cache()
        if progress:
            progress(f"{case.family} {case.label}: {row.get('ratio', row['status'])}")
        rows.append(row)
    return rows
