"""CPU backend: MLX's own CPU ops, which are batch-invariant as they stand.

On the Linux CPU backend every op the mode routes is already invariant: float32 GEMM calls
the bundled reference BLAS (a sequential triple loop), float16/bfloat16 GEMM runs MLX's own
single-threaded blocked loop whose K order does not depend on M, quantized matmul unpacks
groups in a fixed loop, and scaled_dot_product_attention runs a composed fallback whose
softmax and value reductions walk the keys in order (masked keys add exact zeros). Nothing is
multithreaded. So this backend routes to stock and restricts itself to what the test suite
and `bi-verify` prove: float32/float16/bfloat16 operands and affine quantization.
"""

from __future__ import annotations

import mlx.core as mx

from bi_rl import _stock
from bi_rl.backends.base import Backend, Unsupported, quant_params

FLOATS = (mx.float32, mx.float16, mx.bfloat16)
QUANT_BITS = (2, 3, 4, 5, 6, 8)
QUANT_GROUPS = (32, 64, 128)


def _check_float(op: str, *arrays) -> None:
    for a in arrays:
        if a is not None and a.dtype not in FLOATS:
            raise Unsupported(f"{op} of dtype {a.dtype} (float32, float16, bfloat16 only)")


def linear(x, w, bias=None):
    _check_float("linear", x, w, bias)
    return _stock.linear(x, w, bias)


def matmul(a, b):
    _check_float("matmul", a, b)
    return _stock.matmul(a, b)


def addmm(c, a, b, alpha=1.0, beta=1.0):
    _check_float("addmm", c, a, b)
    return _stock.addmm(c, a, b, alpha, beta)


def quantized_matmul(
    x, w, scales, biases=None, transpose=True, group_size=None, bits=None, mode="affine"
):
    _check_float("quantized_matmul", x)
    group_size, bits = quant_params(group_size, bits)
    if mode != "affine" or bits not in QUANT_BITS or group_size not in QUANT_GROUPS:
        raise Unsupported(f"quantization mode={mode} bits={bits} group_size={group_size}")
    return _stock.quantized_matmul(
        x, w, scales, biases, transpose=transpose, group_size=group_size, bits=bits, mode=mode
    )


def scaled_dot_product_attention(q, k, v, scale, mask=None, sinks=None):
    _check_float("scaled_dot_product_attention", q, k, v)
    return _stock.sdpa(q, k, v, scale, mask, sinks)


_STOCK_GEMM = "stock MLX: reference BLAS (f32) / single-threaded blocked loop (f16, bf16)"
BACKEND = Backend(
    name="cpu",
    ops={
        f.__name__: f
        for f in (linear, matmul, addmm, quantized_matmul, scaled_dot_product_attention)
    },
    how={
        "linear": _STOCK_GEMM,
        "matmul": _STOCK_GEMM,
        "addmm": _STOCK_GEMM + ", bias added after",
        "quantized_matmul": "stock MLX: affine groups unpacked in a fixed K loop",
        "scaled_dot_product_attention": "stock MLX composed fallback: keys reduced in order",
    },
)
