"""Batch-invariant softmax over the last axis on MLX's CUDA backend.

kernels/cuda/softmax.cu: one warp per row, fp32 throughout, the sum taken lane-strided from
the row's first nonzero exponential in increasing order and folded by a fixed butterfly, so a
row's bits depend on its nonzero values and their positions relative to the first of them:
not on the row's length (a decode step's keys against a rescoring pass's), the batch or left
padding. Hand-written attention (Gemma 2's soft-capped scores) needs exactly that. Outputs
are computed in fp32 and rounded once to the input's dtype, for `precise` or not.
"""

from __future__ import annotations

from functools import cache

import mlx.core as mx

from bi_rl.backends.base import Unsupported
from bi_rl.backends.cuda._kernels import KernelSpec, Launch, Plans, cdiv, kernel

ROWS_PER_BLOCK = 4  # one warp a row

_BODY = """
  const int n = x_shape[1];
  bi::softmax_rows<T>(x, x_strides[0], x_strides[1], out, x_shape[0], n);
"""


@cache
def spec() -> KernelSpec:
    return KernelSpec("bi_softmax", ("x",), ("out",), ("cuda/common.cuh", "cuda/softmax.cu"), _BODY)


_PLANS = Plans()


def _plan(dtype, rows: int, n: int) -> Launch:
    return Launch(
        kernel=kernel(spec()),
        template=[("T", dtype)],
        grid=(cdiv(rows, ROWS_PER_BLOCK) * ROWS_PER_BLOCK * 32, 1, 1),
        group=(ROWS_PER_BLOCK * 32, 1, 1),
        out_shape=(rows, n),
        out_dtype=dtype,
    )


def softmax(x, precise: bool = False, *, poison=None):
    """mx.softmax(x, axis=-1, precise=precise); poison pre-fills the output (tests)."""
    if x.dtype not in (mx.float16, mx.bfloat16, mx.float32):
        raise Unsupported(f"softmax dtype {x.dtype}")
    if x.ndim == 0 or x.size == 0:
        raise Unsupported(f"softmax of shape {tuple(x.shape)}")
    n = x.shape[-1]
    rows = x.size // n
    sig = (x.dtype, rows, n)
    launch = _PLANS.get(sig) or _PLANS.build(sig, _plan, x.dtype, rows, n)
    return launch(x.reshape(rows, n), init_value=poison).reshape(x.shape)
