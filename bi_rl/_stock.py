"""MLX's own functions, captured at import, before any mode can patch them.

Every invariant implementation and every stock fallback calls these, never the `mx.*`
attributes, which the mode may have replaced.
"""

import mlx.core as mx
import mlx.nn as nn

matmul = mx.matmul
addmm = mx.addmm
quantized_matmul = mx.quantized_matmul
gather_mm = mx.gather_mm
gather_qmm = mx.gather_qmm
scaled_dot_product_attention = mx.fast.scaled_dot_product_attention
compile = mx.compile
softmax = mx.softmax
array_matmul = mx.array.__matmul__
array_imatmul = mx.array.__imatmul__
linear_call = nn.Linear.__call__
quantized_linear_call = nn.QuantizedLinear.__call__


def linear(x, w, bias=None):
    """nn.Linear's own arithmetic: addmm with a bias, x @ w.T without."""
    if bias is not None:
        return addmm(bias, x, w.T)
    return matmul(x, w.T)


def sdpa(q, k, v, scale, mask=None, sinks=None):
    """scaled_dot_product_attention with the positional signature the backends' ops take."""
    return scaled_dot_product_attention(q, k, v, scale=scale, mask=mask, sinks=sinks)
