"""Invariant batched and gathered matmuls composed from a backend's invariant 2-D GEMMs.

A backend whose `matmul` (a @ b, b two-dimensional) and `quantized_matmul` are
batch-invariant gets three more ops from here, with the same guarantee and no new kernel:

  batched_matmul(matmul, a, b)           a @ b with b of three or more dimensions (attention
                                         written by hand: q @ k.swapaxes(-1, -2), p @ v)
  gather_mm(matmul, a, b, ...)           mx.gather_mm (mixture-of-experts layers)
  gather_qmm(quantized_matmul, x, ...)   mx.gather_qmm

and attention's window / ring arguments for a backend whose attention takes masks only:

  windowed_attention(sdpa, q, k, v, ...)  keys rolled from ring storage into position order,
                                         the window turned into a bool mask

Each splits the problem into one 2-D GEMM per right-hand matrix (per batch element of b, per
expert) whose left operand holds every row that multiplies that matrix. A row of the result
is then the 2-D GEMM's row: its reduction order depends on K alone, never on how many other
rows (tokens, heads, query positions) share the call or on which rows they are. The price is
one launch per distinct right-hand matrix, and for the gathers a host read of the expert
indices (the rows of each expert are found on the host). `batched_matmul(..., align=True)`
also starts each row's reduction at its first nonzero element, for GEMMs whose K chunks are
counted from k = 0 (see its docstring).
"""

from __future__ import annotations

import math

import mlx.core as mx
import numpy as np

from bi_rl import _stock
from bi_rl.backends.base import Unsupported

__all__ = [
    "attention_window_args",
    "batched_matmul",
    "gather_mm",
    "gather_qmm",
    "stock_attention",
    "window_mask",
    "windowed_attention",
]


def batched_matmul(matmul, a: mx.array, b: mx.array, align: bool = False) -> mx.array:
    """a @ b (numpy broadcasting of the batch dimensions) for b.ndim >= 3, one 2-D GEMM per
    batch element of b. Batch dimensions along which b is broadcast (size 1) are folded into
    the GEMM's rows, so q (B, H, R, L, D) @ k^T (B, H, 1, D, S) is B * H GEMMs of R * L rows.

    align: start each row's reduction at its own first nonzero element of `a` (rows sharing
    a start share a GEMM over a[:, start:] @ b[start:]). For a GEMM that groups K in chunks
    counted from k = 0, this makes p @ v of attention written by hand independent of how many
    masked keys (exact zeros in p) precede a row's first visible key: left padding in a
    batched cache, or keys before a sliding window. The start is a function of the row's own
    values, so the guarantee stays per row; the price is a host read of the starts."""
    if a.ndim < 2:
        raise Unsupported(f"batched matmul with a {a.ndim}-D left operand")
    m, k = a.shape[-2:]
    if b.shape[-2] != k:
        raise ValueError(f"matmul: shapes {tuple(a.shape)} and {tuple(b.shape)} do not align")
    n = b.shape[-1]
    batch = tuple(np.broadcast_shapes(a.shape[:-2], b.shape[:-2]))
    nb = len(batch)
    b_batch = (1,) * (nb - (b.ndim - 2)) + tuple(b.shape[:-2])
    loop = [i for i in range(nb) if b_batch[i] != 1]
    fold = [i for i in range(nb) if b_batch[i] == 1]
    perm = loop + fold + [nb, nb + 1]
    loop_shape = [batch[i] for i in loop]
    fold_shape = [batch[i] for i in fold]
    rows = math.prod(fold_shape) * m
    a_full = mx.broadcast_to(a, (*batch, m, k)).transpose(perm)
    a_loop = a_full.reshape(math.prod(loop_shape), rows, k)
    lead = nb - (b.ndim - 2)  # batch axes b lacks

    def b_at(i: int) -> mx.array:
        """b's matrix for loop element i: a view (b is often a transposed cache, which a
        reshape would copy whole)."""
        index = [0] * nb
        for axis, j in zip(loop, np.unravel_index(i, loop_shape), strict=True):
            index[axis] = int(j)
        return b[tuple(index[lead:])]

    if align:
        starts = np.array(mx.argmax(a_loop != 0, axis=-1))  # an all-zero row starts at 0
        outs = [_aligned(matmul, a_loop[i], b_at(i), starts[i]) for i in range(len(starts))]
    else:
        outs = [matmul(a_loop[i], b_at(i)) for i in range(a_loop.shape[0])]
    out = mx.stack(outs).reshape(*loop_shape, *fold_shape, m, n)
    return out.transpose(np.argsort(perm).tolist())


def _aligned(matmul, a: mx.array, b: mx.array, starts: np.ndarray) -> mx.array:
    """a @ b with row r reduced from k = starts[r]: one GEMM per distinct start."""
    if not starts.any():
        return matmul(a, b)
    pieces, where = [], []
    for s in np.unique(starts):
        rows = np.flatnonzero(starts == s)
        pieces.append(matmul(a[mx.array(rows), int(s) :], b[int(s) :]))
        where.append(rows)
    out = mx.concatenate(pieces) if len(pieces) > 1 else pieces[0]
    return out[mx.array(np.argsort(np.concatenate(where), kind="stable"))]


def _flat_indices(batch_shape: tuple, indices: mx.array | None) -> mx.array:
    """The gather's indices for one operand: given, or every batch element in order."""
    if indices is not None:
        return indices
    return mx.arange(math.prod(batch_shape), dtype=mx.uint32).reshape(batch_shape)


def _gathered(lhs_batch: tuple, rhs_batch: tuple, lhs, rhs):
    """(result batch shape, lhs index per result matrix, rhs index per result matrix)."""
    li, ri = _flat_indices(lhs_batch, lhs), _flat_indices(rhs_batch, rhs)
    shape = tuple(np.broadcast_shapes(li.shape, ri.shape))
    li = np.broadcast_to(np.array(li), shape).reshape(-1)
    ri = np.broadcast_to(np.array(ri), shape).reshape(-1)
    return shape, li, ri


def _per_expert(x3: mx.array, li: np.ndarray, ri: np.ndarray, gemm) -> mx.array:
    """out[t] = gemm(x3[li[t]], ri[t]) for every t, one gemm call per distinct ri."""
    m, k = x3.shape[-2:]
    if ri.size == 0:
        return mx.zeros((0, m, 0), x3.dtype)
    pieces, where = [], []
    for e in np.unique(ri):
        pos = np.flatnonzero(ri == e)
        rows = x3[mx.array(li[pos])].reshape(len(pos) * m, k)
        y = gemm(rows, int(e))
        pieces.append(y.reshape(len(pos), m, y.shape[-1]))
        where.append(pos)
    order = np.argsort(np.concatenate(where), kind="stable")
    out = mx.concatenate(pieces) if len(pieces) > 1 else pieces[0]
    return out[mx.array(order)] if len(pieces) > 1 else out


def gather_mm(
    matmul,
    a: mx.array,
    b: mx.array,
    lhs_indices: mx.array | None = None,
    rhs_indices: mx.array | None = None,
    sorted_indices: bool = False,
) -> mx.array:
    """mx.gather_mm: out[i] = a[lhs[i]] @ b[rhs[i]] over the broadcast index shape.

    sorted_indices is a speed hint to MLX; the result here does not depend on it."""
    if a.ndim < 2 or b.ndim < 2:
        raise Unsupported(f"gather_mm of {a.ndim}-D and {b.ndim}-D operands")
    shape, li, ri = _gathered(a.shape[:-2], b.shape[:-2], lhs_indices, rhs_indices)
    m, k = a.shape[-2:]
    # mlx-lm passes b as a transposed view of the experts' weights: index it, never reshape
    # it (a reshape would copy every expert's weight on every call).
    b3 = b if b.ndim == 3 else b.reshape(-1, *b.shape[-2:])
    out = _per_expert(a.reshape(-1, m, k), li, ri, lambda rows, e: matmul(rows, b3[e]))
    return out.reshape(*shape, m, b.shape[-1])


def gather_qmm(
    quantized_matmul,
    x: mx.array,
    w: mx.array,
    scales: mx.array,
    biases: mx.array | None = None,
    lhs_indices: mx.array | None = None,
    rhs_indices: mx.array | None = None,
    transpose: bool = True,
    group_size: int | None = None,
    bits: int | None = None,
    mode: str = "affine",
    global_scale: mx.array | None = None,
    sorted_indices: bool = False,
) -> mx.array:
    """mx.gather_qmm: out[i] = quantized_matmul(x[lhs[i]], w[rhs[i]]) per result matrix."""
    if global_scale is not None:
        raise Unsupported(f"gather_qmm with a global scale (mode {mode})")
    if x.ndim < 2 or w.ndim < 2:
        raise Unsupported(f"gather_qmm of {x.ndim}-D and {w.ndim}-D operands")
    shape, li, ri = _gathered(x.shape[:-2], w.shape[:-2], lhs_indices, rhs_indices)
    m, k = x.shape[-2:]
    w3, s3 = w.reshape(-1, *w.shape[-2:]), scales.reshape(-1, *scales.shape[-2:])
    b3 = None if biases is None else biases.reshape(-1, *biases.shape[-2:])

    def gemm(rows, e):
        bias = None if b3 is None else b3[e]
        return quantized_matmul(rows, w3[e], s3[e], bias, transpose, group_size, bits, mode)

    out = _per_expert(x.reshape(-1, m, k), li, ri, gemm)
    return out.reshape(*shape, m, out.shape[-1])


def attention_window_args(window, key_start, batch: int):
    """(window, key_start) of an attention call checked: window None or an int > 0, key_start
    None or an integer array of shape (batch,), returned as int32. ValueError names the problem."""
    if window is not None:
        if isinstance(window, bool) or not isinstance(window, (int, np.integer)) or window <= 0:
            raise ValueError(f"attention window must be a positive int, got {window!r}")
        window = int(window)
    if key_start is not None:
        if not isinstance(key_start, mx.array) or not mx.issubdtype(key_start.dtype, mx.integer):
            raise ValueError(f"attention key_start must be an integer mx.array, got {key_start!r}")
        if key_start.shape != (batch,):
            raise ValueError(
                f"attention key_start must have shape ({batch},) (one ring start per batch "
                f"row), got {tuple(key_start.shape)}"
            )
        if key_start.dtype != mx.int32:
            key_start = key_start.astype(mx.int32)
    return window, key_start


def window_mask(tq: int, tk: int, window: int) -> mx.array:
    """Bool (tq, tk): query i (at key position p = i + tk - tq) sees keys max(0, p - window + 1)
    .. p, the keys a sliding window of `window` keys leaves it."""
    p = mx.arange(tq)[:, None] + (tk - tq)
    j = mx.arange(tk)[None, :]
    return (j <= p) & (j > p - window)


def windowed_attention(sdpa, q, k, v, scale, mask=None, sinks=None, window=None, key_start=None):
    """sdpa(q, k, v, scale, mask, sinks) with attention's `window` and `key_start` (ring
    storage) arguments, as bi_rl.backends.cuda.attention defines them: the keys and values are
    first gathered into position order (logical key j from index (key_start[b] + j) mod Tk),
    then the window becomes a bool mask over logical positions, intersected with `mask`."""
    window, key_start = attention_window_args(window, key_start, q.shape[0])
    tq, tk = q.shape[2], k.shape[2]
    if key_start is not None:
        idx = (key_start[:, None] % tk + mx.arange(tk)[None, :]) % tk
        idx = idx[:, None, :, None]
        k = mx.take_along_axis(k, idx, axis=2)
        v = mx.take_along_axis(v, idx, axis=2)
    if window is not None:
        win = window_mask(tq, tk, window)
        if mask is None or isinstance(mask, str):
            if mask not in (None, "causal"):
                raise ValueError(f"attention mask {mask!r}: only 'causal' is a string mask")
            mask = win  # the window lies inside the causal range
        elif mask.dtype == mx.bool_:
            mask = mask & win
        else:
            mask = mx.where(win, mask, mx.array(-float("inf"), mask.dtype))
    return sdpa(q, k, v, scale, mask, sinks)


def stock_attention(q, k, v, scale, mask=None, sinks=None, *, window=None, key_start=None):
    """Stock MLX attention with the window / ring arguments MLX lacks, composed from stock ops
    (`windowed_attention`); without them, stock MLX's own call."""
    if window is None and key_start is None:
        return _stock.sdpa(q, k, v, scale, mask, sinks)
    return windowed_attention(_stock.sdpa, q, k, v, scale, mask, sinks, window, key_start)
