"""batch_invariant_mode: route MLX's GEMM and attention entry points to invariant kernels.

Inside `with batch_invariant_mode():` the current thread's calls to `mx.matmul` and the `@`
operator (batched right operands too, as attention written by hand uses them), `mx.addmm`,
`nn.Linear`, `nn.QuantizedLinear` / `mx.quantized_matmul`, `mx.gather_mm` / `mx.gather_qmm`
(mixture-of-experts layers), `mx.fast.scaled_dot_product_attention` and `mx.softmax` (which
hand-written attention normalises its scores with) run the active
backend's batch-invariant implementation (bi_rl.ops), so mlx-lm models run unchanged. Ops the
mode cannot make invariant yet (conv, einsum, tensordot, block_masked_mm, segmented_mm, qqmm,
gather_qqmm) raise NotImplementedError in strict mode, naming the op and the model layer,
instead of running silently variant; with strict=False they warn once and run stock.

An nn.Linear or nn.QuantizedLinear that bi_rl.fusion grouped with its siblings (q/k/v,
gate/up: a rollout on Hopper groups them, other callers opt in) computes the group's products
in one `ops.grouped_linear` (`ops.grouped_quantized_matmul`) call, with the bits of separate
calls.

The mode is per thread. The wrappers are installed while any thread is inside the mode and
consult the calling thread's state, so a thread outside keeps stock behaviour meanwhile.
The last thread to leave restores every patched symbol, also when the body raised. Modes
nest; the innermost strictness wins.

Compilation: inside the mode `mx.compile` is `bi_rl.compile`, which keeps one trace per mode
state, so a function compiled there traces invariant ops when called inside the mode and
stock ops when called outside. A function compiled with MLX's own `mx.compile` and already
traced outside the mode keeps that stock trace when called inside it (MLX caches traces per
function and input signature): compile with `bi_rl.compile`, or inside the mode, instead.
"""

from __future__ import annotations

import functools
import threading
from contextlib import contextmanager, nullcontext

import mlx.core as mx
import mlx.nn as nn

from bi_rl import _state, _stock, backends, fusion, ops

__all__ = [
    "DEFAULT_MODE",
    "MODES",
    "batch_invariant_mode",
    "check_mode",
    "compile",
    "held",
    "named_mode",
    "patched_symbols",
    "suspended",
]


def _on(stream):
    return nullcontext() if stream is None else mx.stream(stream)


def _arr(x):
    return x if isinstance(x, mx.array) else mx.array(x)


def _matmul(a, b, /, *, stream=None):
    if not _state.in_mode():
        return _stock.matmul(a, b, stream=stream)
    with _on(stream):
        return ops.matmul(_arr(a), _arr(b))


def _addmm(c, a, b, /, alpha=1.0, beta=1.0, *, stream=None):
    if not _state.in_mode():
        return _stock.addmm(c, a, b, alpha, beta, stream=stream)
    with _on(stream):
        return ops.addmm(_arr(c), _arr(a), _arr(b), alpha, beta)


def _quantized_matmul(
    x,
    w,
    /,
    scales,
    biases=None,
    transpose=True,
    group_size=None,
    bits=None,
    mode="affine",
    *,
    stream=None,
):
    if not _state.in_mode():
        return _stock.quantized_matmul(
            x, w, scales, biases, transpose, group_size, bits, mode, stream=stream
        )
    with _on(stream):
        return ops.quantized_matmul(x, w, scales, biases, transpose, group_size, bits, mode)


def _gather_mm(a, b, /, lhs_indices=None, rhs_indices=None, *, sorted_indices=False, stream=None):
    if not _state.in_mode():
        return _stock.gather_mm(
            a, b, lhs_indices, rhs_indices, sorted_indices=sorted_indices, stream=stream
        )
    with _on(stream):
        return ops.gather_mm(a, b, lhs_indices, rhs_indices, sorted_indices)


def _gather_qmm(
    x,
    w,
    /,
    scales,
    biases=None,
    lhs_indices=None,
    rhs_indices=None,
    transpose=True,
    group_size=None,
    bits=None,
    mode="affine",
    global_scale=None,
    *,
    sorted_indices=False,
    stream=None,
):
    args = (x, w, scales, biases, lhs_indices, rhs_indices, transpose, group_size, bits, mode)
    if not _state.in_mode():
        extra = {} if global_scale is None else {"global_scale": global_scale}
        return _stock.gather_qmm(*args, sorted_indices=sorted_indices, stream=stream, **extra)
    with _on(stream):
        return ops.gather_qmm(*args, global_scale, sorted_indices)


def _sdpa(q, k, v, *, scale, mask=None, sinks=None, force_fused=False, stream=None):
    if not _state.in_mode():
        return _stock.scaled_dot_product_attention(
            q, k, v, scale=scale, mask=mask, sinks=sinks, force_fused=force_fused, stream=stream
        )
    if stream is None:  # a model's call, once a layer and step: no context to enter
        return ops.scaled_dot_product_attention(q, k, v, scale, mask, sinks)
    with mx.stream(stream):
        return ops.scaled_dot_product_attention(q, k, v, scale, mask, sinks)


def _softmax(a, axis=None, *, precise=False, stream=None):
    if not _state.in_mode():
        return _stock.softmax(a, axis, precise=precise, stream=stream)
    with _on(stream):
        return ops.softmax(_arr(a), axis, precise)


def _array_operator(stock):
    """mx.array's @ or @= (`stock`), routed to the invariant matmul inside the mode."""

    def operator(self, other):
        if not _state.in_mode():
            return stock(self, other)
        return ops.matmul(self, _arr(other))

    return operator


_array_matmul = _array_operator(_stock.array_matmul)
_array_imatmul = _array_operator(_stock.array_imatmul)


_GROUPED = fusion.MEMBERS  # layers grouped with their siblings (bi_rl.fusion)


def _linear_call(self, x):
    if not _state.in_mode():
        return _stock.linear_call(self, x)
    entry = _GROUPED.get(id(self))
    if entry is not None:
        return fusion.call(entry, self, x)
    return ops.linear(x, self["weight"], self.get("bias"))


def _quantized_linear_call(self, x):
    if not _state.in_mode():
        return _stock.quantized_linear_call(self, x)
    entry = _GROUPED.get(id(self))
    if entry is not None:
        return fusion.call(entry, self, x)
    return fusion.quantized_linear(self, x)


def _describe(args, kwargs) -> str:
    shapes = [
        f"{tuple(a.shape)} {a.dtype}" for a in (*args, *kwargs.values()) if isinstance(a, mx.array)
    ]
    return "arguments " + ", ".join(shapes) if shapes else "no array arguments"


def _refusing(name: str, stock):
    """A wrapper that refuses `name` inside a strict mode and warns once in a lax one."""

    @functools.wraps(stock)
    def wrapper(*args, **kwargs):
        if not _state.in_mode():
            return stock(*args, **kwargs)
        reason = f"no batch-invariant implementation of {name} yet ({_describe(args, kwargs)})"
        return ops.unsupported(name, reason, stock, *args, **kwargs)

    return wrapper


def compile(fun, inputs=None, outputs=None, shapeless=False):
    """mx.compile that keeps one trace per mode state (outside, strict, lax) and backend."""
    traces = {}
    lock = threading.Lock()

    @functools.wraps(fun)
    def call(*args, **kwargs):
        s = _state.stack()
        key = (s[-1] if s else None, id(backends.active()))
        compiled = traces.get(key)
        if compiled is None:
            with lock:
                compiled = traces.get(key)
                if compiled is None:
                    # A fresh function object per key: MLX caches traces by function identity.
                    def traced(*a, **k):
                        return fun(*a, **k)

                    compiled = traces[key] = _stock.compile(traced, inputs, outputs, shapeless)
        return compiled(*args, **kwargs)

    return call


_REFUSED = (
    "gather_qqmm", "qqmm", "block_masked_mm", "segmented_mm",
    "conv1d", "conv2d", "conv3d", "conv_general", "conv_transpose1d", "conv_transpose2d",
    "conv_transpose3d", "convolve", "einsum", "tensordot", "inner",
)  # fmt: skip


def _patch_table():
    table = [
        (mx, "matmul", _matmul),
        (mx, "addmm", _addmm),
        (mx, "quantized_matmul", _quantized_matmul),
        (mx, "gather_mm", _gather_mm),
        (mx, "gather_qmm", _gather_qmm),
        (mx.fast, "scaled_dot_product_attention", _sdpa),
        (mx, "softmax", _softmax),
        (mx.array, "__matmul__", _array_matmul),
        (mx.array, "__imatmul__", _array_imatmul),
        (nn.Linear, "__call__", _linear_call),
        (nn.QuantizedLinear, "__call__", _quantized_linear_call),
        (mx, "compile", compile),
    ]
    table += [
        (mx, name, _refusing(name, getattr(mx, name))) for name in _REFUSED if hasattr(mx, name)
    ]
    return table


_PATCHES = _patch_table()
_lock = threading.Lock()
_entries = 0  # mode entries alive across all threads; wrappers are installed while > 0
_saved: list[tuple[object, str, object]] = []


def patched_symbols() -> list[str]:
    """Names of every symbol the mode replaces while it is active."""
    return [f"{getattr(o, '__name__', o)}.{a}" for o, a, _ in _PATCHES]


def _install() -> None:
    for owner, attr, wrapper in _PATCHES:
        _saved.append((owner, attr, getattr(owner, attr)))
        setattr(owner, attr, wrapper)


def _restore() -> None:
    while _saved:
        owner, attr, original = _saved.pop()
        setattr(owner, attr, original)


@contextmanager
def batch_invariant_mode(strict: bool = True):
    """Run the body with MLX's GEMM and attention entry points batch-invariant on this thread.

    strict=True: an op, shape or dtype the active backend cannot make invariant raises
    NotImplementedError naming op and backend. strict=False: it warns once per op and runs
    stock MLX. Exception-safe, nestable, per thread; usable as a decorator too.
    """
    stack = _state.stack()
    with _installed():
        stack.append(bool(strict))
        try:
            yield
        finally:
            stack.pop()


@contextmanager
def _installed():
    """The wrappers in place for the block: installed by the first entry alive across all
    threads, restored when the last one leaves."""
    global _entries
    with _lock:
        if _entries == 0:
            try:
                _install()
            except BaseException:
                _restore()
                raise
        _entries += 1
    try:
        yield
    finally:
        with _lock:
            _entries -= 1
            if _entries == 0:
                _restore()


@contextmanager
def held():
    """Keep the mode's wrappers installed for the block without entering the mode.

    Inside it, entering and leaving batch_invariant_mode only pushes and pops this thread's
    mode stack instead of replacing and restoring every patched symbol, for a loop that
    enters the mode once a step. Outside the mode the wrappers run stock MLX (as they do for
    any thread not in the mode while another thread is), so nothing else changes.
    """
    with _installed():
        yield


@contextmanager
def suspended():
    """Run this thread on stock MLX for the block, even inside batch_invariant_mode.

    For what must stay on MLX's own ops inside the mode, such as the differentiable half of
    a trainer's value-exact logprobs (invariant kernels are forward-only). Other threads keep
    their modes; this thread's mode stack comes back on exit, also when the block raises.
    """
    stack = _state.stack()
    saved = list(stack)
    stack.clear()
    try:
        yield
    finally:
        stack[:] = saved


# The run modes the engine, scorer and CLIs accept: the mode strict, the mode lax (stock MLX
# where no invariant kernel exists, with a warning), or stock MLX throughout (a control).
MODES = ("strict", "fallback", "off")
DEFAULT_MODE = "strict"


def check_mode(mode: str) -> None:
    """Raise ValueError unless `mode` names a run mode in MODES."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")


def named_mode(mode: str):
    """The context for a run mode named in MODES."""
    check_mode(mode)
    return nullcontext() if mode == "off" else batch_invariant_mode(strict=mode == "strict")
