"""CPU backend: MLX's own CPU ops, which are batch-invariant as they stand.

On the Linux CPU backend every op the mode routes is already invariant: float32 GEMM calls
the bundled reference BLAS (a sequential triple loop), float16/bfloat16 GEMM runs MLX's own
single-threaded blocked loop whose K order does not depend on M, quantized matmul unpacks
groups in a fixed loop, and scaled_dot_product_attention runs a composed fallback whose
softmax and value reductions walk the keys in order (masked keys add exact zeros). Nothing is
multithreaded. Attention's window and ring (key_start) arguments are composed from stock ops
(keys gathered into position order, the window as a mask). So this backend routes to stock
and restricts itself to what the test suite and `bi-verify` prove: float32/float16/bfloat16
operands and affine quantization.

The same holds for the matmuls of mixture-of-experts layers and of attention written by
hand: stock gather_qmm, float32 gather_mm and batched matmuls compute each result row with
the same loops (tests/test_stock_invariance.py). Stock gather_mm accepts float32 only on the
CPU, so half-precision gather_mm runs here one GEMM per expert (bi_rl.backends.composed).
"""

from __future__ import annotations

import mlx.core as mx

from bi_rl import _stock
from bi_rl.backends import composed
from bi_rl.backends.base import Backend, Unsupported, quant_params

FLOATS = (mx.float32, mx.float16, mx.bfloat16)
QUANT_BITS = (2, 3, 4, 5, 6, 8)
QUANT_GROUPS = (32, 64, 128)


def _check_float(op: str, *arrays) -> None:
    for a in arrays:
        if a is not None and a.dtype not in FLOATS:
            raise Unsupported(
                f"{op} of dtype {a.dtype} (float32, float16, bfloat16 only: load the model in "
                "one of those)"
            )


def linear(x, w, bias=None):
    _check_float("linear", x, w, bias)
    return _stock.linear(x, w, bias)


def grouped_linear(x, ws):
    # The members one by one through this backend's own linear, so each output has exactly
    # linear's bits; a single call computing them all could replace the loop where it keeps them.
    return [linear(x, w) for w in ws]


def matmul(a, b):
    _check_float("matmul", a, b)
    return _stock.matmul(a, b)


def addmm(c, a, b, alpha=1.0, beta=1.0):
    _check_float("addmm", c, a, b)
    return _stock.addmm(c, a, b, alpha, beta)


def _check_quant(op: str, x, group_size, bits, mode) -> tuple[int, int]:
    _check_float(op, x)
    group_size, bits = quant_params(group_size, bits)
    if mode != "affine" or bits not in QUANT_BITS or group_size not in QUANT_GROUPS:
        raise Unsupported(
            f"quantization mode={mode} bits={bits} group_size={group_size} (affine, "
            f"{'/'.join(map(str, QUANT_BITS))} bits, groups "
            f"{'/'.join(map(str, QUANT_GROUPS))} only: quantize the model that way)"
        )
    return group_size, bits


def quantized_matmul(
    x, w, scales, biases=None, transpose=True, group_size=None, bits=None, mode="affine"
):
    group_size, bits = _check_quant("quantized_matmul", x, group_size, bits, mode)
    return _stock.quantized_matmul(
        x, w, scales, biases, transpose=transpose, group_size=group_size, bits=bits, mode=mode
    )


def grouped_quantized_matmul(x, members, group_size=None, bits=None):
    # The members one by one through this backend's own quantized_matmul: each output has
    # exactly its bits.
    return [quantized_matmul(x, w, s, b, True, group_size, bits) for w, s, b in members]


def scaled_dot_product_attention(
    q, k, v, scale, mask=None, sinks=None, *, window=None, key_start=None
):
    _check_float("scaled_dot_product_attention", q, k, v)
    return composed.stock_attention(q, k, v, scale, mask, sinks, window=window, key_start=key_start)


def batched_matmul(a, b):
    _check_float("batched_matmul", a, b)
    return _stock.matmul(a, b)


def gather_mm(a, b, lhs_indices=None, rhs_indices=None, sorted_indices=False):
    _check_float("gather_mm", a, b)
    if a.dtype == b.dtype == mx.float32:
        return _stock.gather_mm(a, b, lhs_indices, rhs_indices, sorted_indices=sorted_indices)
    return composed.gather_mm(_stock.matmul, a, b, lhs_indices, rhs_indices)


def gather_qmm(
    x,
    w,
    scales,
    biases=None,
    lhs_indices=None,
    rhs_indices=None,
    transpose=True,
    group_size=None,
    bits=None,
    mode="affine",
    global_scale=None,
    sorted_indices=False,
):
    group_size, bits = _check_quant("gather_qmm", x, group_size, bits, mode)
    if global_scale is not None:
        raise Unsupported("gather_qmm with a global scale (nvfp4)")
    return _stock.gather_qmm(
        x,
        w,
        scales,
        biases,
        lhs_indices,
        rhs_indices,
        transpose=transpose,
        group_size=group_size,
        bits=bits,
        mode=mode,
        sorted_indices=sorted_indices,
    )


_STOCK_GEMM = "stock MLX: reference BLAS (f32) / single-threaded blocked loop (f16, bf16)"


def softmax(x, precise=False):
    # MLX's CPU softmax walks a row in order (masked keys add exact zeros): invariant as is.
    return _stock.softmax(x, axis=-1, precise=precise)


_OPS = (
    linear,
    grouped_linear,
    matmul,
    batched_matmul,
    addmm,
    quantized_matmul,
    grouped_quantized_matmul,
    scaled_dot_product_attention,
)
BACKEND = Backend(
    name="cpu",
    ops={f.__name__: f for f in (*_OPS, gather_mm, gather_qmm, softmax)},
    how={
        "linear": _STOCK_GEMM,
        "grouped_linear": "one stock linear per weight (the bits of linear by construction)",
        "matmul": _STOCK_GEMM,
        "addmm": _STOCK_GEMM + ", bias added after",
        "quantized_matmul": "stock MLX: affine groups unpacked in a fixed K loop",
        "grouped_quantized_matmul": "one quantized_matmul per member (its bits by construction)",
        "scaled_dot_product_attention": "stock MLX composed fallback: keys reduced in order",
        "batched_matmul": _STOCK_GEMM + ", one batch element at a time",
        "gather_mm": "stock MLX (f32): one GEMM per gathered matrix; f16/bf16: one stock GEMM "
        "per expert over the rows routed to it",
        "gather_qmm": "stock MLX: affine groups unpacked in a fixed K loop per gathered matrix",
        "softmax": "stock MLX: each row's sum walks the row in order",
    },
)
