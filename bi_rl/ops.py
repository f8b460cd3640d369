"""The invariant ops, callable directly or through `batch_invariant_mode`.

Each function computes what its MLX namesake computes, through the active backend's
batch-invariant implementation: row i of the output depends only on row i of the input
(for attention, only on that query row and its own valid keys), never on how many other rows
share the call, where padding sits, or how large the cache view is.

Where the backend cannot promise that for the given op, shape or dtype, strict mode (the
default, also outside any mode) raises NotImplementedError naming op, backend and arguments;
`batch_invariant_mode(strict=False)` warns once per op and runs stock MLX instead.
"""

from __future__ import annotations

import threading
import warnings

import mlx.core as mx

from bi_rl import _state, _stock, _where, backends
from bi_rl.backends import Unsupported, composed

__all__ = [
    "BatchVariantWarning",
    "addmm",
    "gather_mm",
    "gather_qmm",
    "grouped_linear",
    "linear",
    "matmul",
    "quantized_matmul",
    "scaled_dot_product_attention",
    "softmax",
    "unsupported",
]


class BatchVariantWarning(UserWarning):
    """A call inside a non-strict mode fell back to stock MLX, which may be batch-variant."""


_warned: set[tuple[str, str]] = set()
_warned_lock = threading.Lock()


# What a user can do about a refusal, whatever its reason (the reason may add a specific fix).
FALLBACK_HINT = (
    "to run it anyway, use --mode fallback (batch_invariant_mode(strict=False)): stock MLX for "
    "this op, with a warning"
)


def unsupported(op: str, reason: str, fallback, *args, **kwargs):
    """Raise (strict) or warn once per op and run the stock `fallback` (non-strict).

    The message names the op, the backend, the model layer running it (when a model is on
    the call stack) and the reason."""
    backend = backends.active().name
    layer = _where.current_layer()
    where = f" in layer {layer}" if layer else ""
    message = f"bi_rl: {op} on the {backend} backend is not batch-invariant{where}: {reason}"
    if _state.strict():
        raise NotImplementedError(f"{message}; {FALLBACK_HINT}")
    with _warned_lock:
        first = (backend, op) not in _warned
        _warned.add((backend, op))
    if first:
        warnings.warn(message + "; running stock MLX instead", BatchVariantWarning, stacklevel=3)
    return fallback(*args, **kwargs)


# A backend's ops may map an op to STOCK_OP: it then runs stock MLX, with no refusal and no
# warning, in every mode. Not for users (it silently gives up the guarantee): benchmarks use
# it to time strict mode with one op family invariant and the others stock.
STOCK_OP = object()


def _dispatch(op: str, fallback, *args, **kwargs):
    backend = backends.active()
    impl = backend.ops.get(op)
    if impl is STOCK_OP:
        return fallback(*args, **kwargs)
    try:
        if impl is None:
            raise Unsupported("this backend has no invariant kernel for it yet")
        return impl(*args, **kwargs)
    except Unsupported as e:
        return unsupported(op, str(e), fallback, *args, **kwargs)


def _shape(x) -> str:
    return f"{tuple(x.shape)} {x.dtype}"


_FLOATS = (mx.float32, mx.float16, mx.bfloat16)


def _promoted(*xs):
    """GEMM operands of different float dtypes cast to float32, as MLX promotes them (any two
    of float32, float16, bfloat16 that differ give float32), so the backend sees one dtype.
    Casting up is exact, so the invariant product of the cast operands is the value stock
    MLX computes; it is how a float32 LoRA adapter meets a bfloat16 model."""
    first = xs[0].dtype
    for x in xs:  # the common case, one dtype, without building a set (the decode path)
        if x is not None and x.dtype != first:
            break
    else:
        return xs
    dtypes = {x.dtype for x in xs if x is not None}
    if len(dtypes) < 2 or not dtypes <= set(_FLOATS):
        return xs
    return tuple(None if x is None else x.astype(mx.float32) for x in xs)


def linear(x: mx.array, w: mx.array, bias: mx.array | None = None) -> mx.array:
    """x @ w.T (+ bias), w in the nn.Linear layout (out_features, in_features)."""
    if bias is None and x.dtype == w.dtype:  # a decode step's most frequent call: no promotion
        return _dispatch("linear", _stock.linear, x, w)
    return _dispatch("linear", _stock.linear, *_promoted(x, w, bias))


def grouped_linear(x: mx.array, ws) -> list[mx.array]:
    """[linear(x, w) for w in ws] with exactly those bits, as one backend call where the
    backend has one: sibling projections of one activation (q/k/v, gate/up).

    Each element of an invariant GEMM's output is reduced in an order that depends on K alone,
    so a backend may compute all of ws in one launch without changing a bit. A backend without
    grouped_linear, or weights that are not all (N_i, K) matrices of x's dtype (a promotion or a
    shape error is then linear's to handle), get one `linear` call per weight: separate
    invariant launches give the same bits, so a missing grouped op is no refusal."""
    ws = list(ws)
    if not ws:
        raise ValueError("grouped_linear needs at least one weight")
    if backends.active().ops.get("grouped_linear") is None or not _weights_of(x, ws):
        return [linear(x, w) for w in ws]
    return _dispatch("grouped_linear", _stock_grouped_linear, x, ws)


def _weights_of(x: mx.array, ws: list[mx.array]) -> bool:
    """Whether every w is an (N_i, K) weight of x's dtype: what a backend's grouped_linear takes."""
    k = x.shape[-1] if x.ndim else None
    return all(w.dtype == x.dtype and w.ndim == 2 and w.shape[1] == k for w in ws)


def _stock_grouped_linear(x, ws):
    return [_stock.linear(x, w) for w in ws]


def matmul(a: mx.array, b: mx.array) -> mx.array:
    """a @ b as mx.matmul: a vector b is one column; a right operand with batch dimensions
    (attention written by hand: q @ k.swapaxes(-1, -2), p @ v) goes to `batched_matmul`."""
    if b.ndim == 1:
        return matmul(a, b[:, None])[..., 0]
    if a.ndim == 1:
        return matmul(a[None], b)[0]
    if b.ndim != 2:
        return _dispatch("batched_matmul", _stock.matmul, *_promoted(a, b))
    return _dispatch("matmul", _stock.matmul, *_promoted(a, b))


def addmm(c: mx.array, a: mx.array, b: mx.array, alpha: float = 1.0, beta: float = 1.0) -> mx.array:
    """alpha * (a @ b) + beta * c, as mx.addmm, with a two-dimensional b."""
    if b.ndim != 2 or a.ndim < 2:
        return unsupported(
            "addmm", f"operands {_shape(a)} @ {_shape(b)}", _stock.addmm, c, a, b, alpha, beta
        )
    return _dispatch("addmm", _stock.addmm, *_promoted(c, a, b), alpha, beta)


def quantized_matmul(
    x: mx.array,
    w: mx.array,
    scales: mx.array,
    biases: mx.array | None = None,
    transpose: bool = True,
    group_size: int | None = None,
    bits: int | None = None,
    mode: str = "affine",
) -> mx.array:
    """mx.quantized_matmul with the same signature, through the invariant backend."""
    args = (x, w, scales, biases, transpose, group_size, bits, mode)
    if w.ndim != 2:
        return unsupported(
            "quantized_matmul",
            f"batched quantized weight {_shape(w)}",
            _stock.quantized_matmul,
            *args,
        )
    return _dispatch("quantized_matmul", _stock.quantized_matmul, *args)


def grouped_quantized_matmul(
    x: mx.array, members, group_size: int | None = None, bits: int | None = None
) -> list[mx.array]:
    """[quantized_matmul(x, w, s, b, True, group_size, bits) for (w, s, b) in members] with
    exactly those bits, as one backend call where the backend has one: sibling affine-quantized
    projections of one activation (q/k/v, gate/up of a quantized model).

    As for grouped_linear: each output element's order depends on K alone, so one launch may
    compute every member. A backend without the op, or members that are not all 2-D packed
    weights with biases, get one quantized_matmul call per member (its checks and errors)."""
    members = [tuple(m) for m in members]
    if not members:
        raise ValueError("grouped_quantized_matmul needs at least one member")
    if backends.active().ops.get("grouped_quantized_matmul") is None or not all(
        len(m) == 3 and m[0].ndim == 2 and m[2] is not None for m in members
    ):
        return [quantized_matmul(x, w, s, b, True, group_size, bits) for w, s, b in members]
    return _dispatch("grouped_quantized_matmul", _stock_grouped_qmm, x, members, group_size, bits)


def _stock_grouped_qmm(x, members, group_size=None, bits=None):
    return [
        _stock.quantized_matmul(x, w, s, b, transpose=True, group_size=group_size, bits=bits)
        for w, s, b in members
    ]


def gather_mm(
    a: mx.array,
    b: mx.array,
    lhs_indices: mx.array | None = None,
    rhs_indices: mx.array | None = None,
    sorted_indices: bool = False,
) -> mx.array:
    """mx.gather_mm (mixture-of-experts layers): each result matrix a[lhs[i]] @ b[rhs[i]]
    depends only on its own rows and expert, sorted or unsorted indices alike."""
    args = (a, b, lhs_indices, rhs_indices, sorted_indices)
    return _dispatch("gather_mm", _stock_gather_mm, *args)


def gather_qmm(
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
    """mx.gather_qmm with the same signature, through the invariant backend."""
    args = (x, w, scales, biases, lhs_indices, rhs_indices, transpose, group_size, bits, mode)
    return _dispatch("gather_qmm", _stock_gather_qmm, *args, global_scale, sorted_indices)


def _stock_gather_mm(a, b, lhs_indices, rhs_indices, sorted_indices):
    return _stock.gather_mm(a, b, lhs_indices, rhs_indices, sorted_indices=sorted_indices)


def _stock_gather_qmm(*args):
    *args, global_scale, sorted_indices = args
    extra = {} if global_scale is None else {"global_scale": global_scale}
    return _stock.gather_qmm(*args, sorted_indices=sorted_indices, **extra)


def softmax(x: mx.array, axis=None, precise: bool = False) -> mx.array:
    """mx.softmax(x, axis, precise=precise): over the last axis by the backend's invariant
    kernel (hand-written attention normalises its scores with it); another single axis is
    moved last and back, axis None is the whole array as one row."""
    if axis is None:
        return softmax(x.reshape(-1), -1, precise).reshape(x.shape)
    if isinstance(axis, (list, tuple)):
        if len(axis) != 1:
            return unsupported(
                "softmax",
                f"over several axes {tuple(axis)} of {_shape(x)}",
                _stock.softmax,
                x,
                axis,
                precise=precise,
            )
        axis = axis[0]
    axis = axis % x.ndim if x.ndim else axis
    if x.ndim and axis != x.ndim - 1:
        return mx.moveaxis(softmax(mx.moveaxis(x, axis, -1), -1, precise), -1, axis)
    return _dispatch("softmax", _stock_softmax, x, precise=precise)


def _stock_softmax(x, precise=False):
    return _stock.softmax(x, axis=-1, precise=precise)


def scaled_dot_product_attention(
    q: mx.array,
    k: mx.array,
    v: mx.array,
    scale: float,
    mask: None | str | mx.array = None,
    sinks: mx.array | None = None,
    *,
    window: int | None = None,
    key_start: mx.array | None = None,
) -> mx.array:
    """mx.fast.scaled_dot_product_attention: q [B, Nq, Tq, D], k/v [B, Nkv, Tk, D].

    window: a sliding window of that many keys (query i at key position i + Tk - Tq sees
    the keys up to that position and window - 1 before it); key_start [B]: keys stored in a
    ring, logical key j at index (key_start[b] + j) mod Tk, masks over logical positions.
    bi_rl.backends.cuda.attention's docstring defines both; the stock fallback composes them.
    """
    op, stock = "scaled_dot_product_attention", composed.stock_attention
    # window / key_start reach the backend only when given (a mask-only backend needs neither)
    if window is None and key_start is None:
        return _dispatch(op, stock, q, k, v, scale, mask, sinks)
    return _dispatch(op, stock, q, k, v, scale, mask, sinks, window=window, key_start=key_start)
