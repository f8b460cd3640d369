"""Sibling projections computed as one product over their concatenated weights.

An attention block's q_proj, k_proj and v_proj read the same activation, and so do an MLP's
gate_proj and up_proj. `concatenated(model)` rebuilds each such set (bi_rl.fusion's sibling
sets: plain nn.Linear, or affine nn.QuantizedLinear, alike and without bias) around one array
per weight kind: the members' weights (and scales and biases) concatenated along the output
dimension, each member's own array replaced by its rows of that concatenation (an MLX slice
of whole rows shares the buffer, so once the originals are freed the model holds what it
held before). For the block's duration each member is swapped in its parent for a `Part`,
which computes the whole set's product on the first call with an activation and hands each
sibling called with that same activation object its own columns: one GEMM launch where there
were three (or two), in either mode. On exit the members are back in their parents, each
holding its slice.

Invariant: inside batch_invariant_mode a part returns exactly the bits of its member's own
`ops.linear(x, weight)` (`ops.quantized_matmul(...)`): the invariant GEMM computes an output
element from its row of x and its column of the weight in an order fixed by K alone, so
computing more columns beside it changes none of its operations. Outside the mode the
product is stock MLX's over the wider weight, whose bits may differ from the members' own
products, as stock's differ between any two shapes.

The engine and the scorer rebuild a model this way where `chosen_sets()` names sets
(BI_RL_CONCAT_PROJECTIONS=1 every set, =attention q/k/v only, =mlp gate/up only, =0 none).
Unset, on a Hopper GPU, where it was timed (BENCHMARK.md): every set inside the mode (strict
mode's decode step was faster), and outside it every set for a rollout whose decode steps
run several rows. There each stock product of more than one row is a cuBLAS call (MLX
captures each into a CUDA graph), queuing a stock decode step's kernels takes most of its
time, and a layer makes four such calls instead of seven; with one row stock MLX runs its own
matrix-vector kernel, where the concatenation was slower, and the scorer's stock products
were not timed faster with it. None on other backends, where it was not timed. Which pays
depends on what reads the outputs: a member's columns of a product over
several rows are a strided view, which MLX's RMSNorm copies into a contiguous array before
its kernel (Qwen3's q_norm and k_norm: a copy where the separate product was contiguous),
while the rotary embedding handles (or copies) it as it does the plain path's transposed
input and the MLP's elementwise gate reads strided inputs as they are. Users of the library
can do the same:

    from bi_rl.concat import concatenated
    with concatenated(model):       # the number of sets rebuilt
        ...                         # forwards in any mode
"""

from __future__ import annotations

import os
import threading
from contextlib import contextmanager

import mlx.core as mx
import mlx.nn as nn

from bi_rl import _state, backends, ops
from bi_rl.fusion import SIBLINGS, sibling_slots

__all__ = [
    "ATTENTION",
    "CHOICES",
    "CONCAT_ENV",
    "MLP",
    "Part",
    "chosen_sets",
    "concatenated",
    "enabled",
    "faster_here",
]

# BI_RL_CONCAT_PROJECTIONS: which sibling sets the engine and the scorer compute as one
# product over their concatenated weights.
CONCAT_ENV = "BI_RL_CONCAT_PROJECTIONS"
ATTENTION, MLP = SIBLINGS  # ("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj")
CHOICES = {"": (), "0": (), "1": SIBLINGS, "attention": (ATTENTION,), "mlp": (MLP,)}


def chosen_sets(invariant: bool = False, rows: int | None = None) -> tuple[tuple[str, ...], ...]:
    """The sibling sets (names as in bi_rl.fusion.SIBLINGS) to concatenate for a run inside
    the mode (`invariant`) or outside it: those BI_RL_CONCAT_PROJECTIONS names, or unset,
    where `faster_here()` every set inside the mode and, outside it, every set for a rollout
    whose decode steps run more than one row (`rows`: the most rows a decode step holds; None
    for a run that does not decode, the scorer's), none otherwise. ValueError naming the
    variable for a value outside CHOICES."""
    value = os.environ.get(CONCAT_ENV, "")
    if value not in CHOICES:
        choices = ", ".join(repr(c) for c in CHOICES if c)
        raise ValueError(f"{CONCAT_ENV} must be one of {choices} (or unset), got {value!r}")
    if value == "" and (invariant or (rows or 0) > 1) and faster_here():
        return SIBLINGS
    return CHOICES[value]


def faster_here() -> bool:
    """Whether the active backend is the one concatenation was timed faster on inside the
    mode: the CUDA backend on a Hopper GPU (its wgmma GEMM, bi_rl.backends.cuda.gemm)."""
    if backends.active().name != "cuda":
        return False
    from bi_rl.backends.cuda import hopper

    return hopper.available()


def enabled(invariant: bool = False) -> bool:
    """Whether the engine and the scorer rebuild any of their model's sibling sets for a run
    inside the mode (`invariant`) or outside it."""
    return bool(chosen_sets(invariant))


def _matmul(x, arrays: tuple, quant: tuple | None):
    """x times the weight in `arrays` (weight, or weight, scales, biases with `quant`: group
    size, bits, mode), transposed as nn.Linear's: the mode's op inside it, stock MLX's
    outside."""
    if quant is None:
        (w,) = arrays
        return ops.linear(x, w) if _state.in_mode() else x @ w.T
    w, scales, biases = arrays
    g, bits, mode = quant
    if _state.in_mode():
        return ops.quantized_matmul(x, w, scales, biases, True, g, bits, mode)
    return mx.quantized_matmul(
        x, w, scales, biases, transpose=True, group_size=g, bits=bits, mode=mode
    )


class _Product:
    """One set's concatenated arrays, where each member's columns start, and per thread the
    outputs of the last activation it was called with that no member has taken yet."""

    def __init__(self, members: list[nn.Module]):
        first = members[0]
        self.quant = None
        keys = ("weight",)
        if type(first) is nn.QuantizedLinear:
            self.quant = (first.group_size, first.bits, first.mode)
            keys = ("weight", "scales", "biases")
        self.arrays = tuple(mx.concatenate([m[k] for m in members]) for k in keys)
        rows = [m["weight"].shape[0] for m in members]
        self.starts = [sum(rows[:i]) for i in range(len(rows) + 1)]
        self.splits = self.starts[1:-1]  # where mx.split cuts the product
        for m, lo, hi in zip(members, self.starts[:-1], self.starts[1:], strict=True):
            for k, whole in zip(keys, self.arrays, strict=True):
                m[k] = whole[lo:hi]
        # One evaluation for the set, the concatenation and the slices (views of it), and one
        # device synchronisation; the originals go once it is done, so at most one set's
        # weights are held twice.
        mx.eval(self.arrays, [m.parameters() for m in members])
        self.keys = keys
        self.own = [tuple(m[k] for k in keys) for m in members]  # what each Part must hold
        self.local = _Pending()
        self.kept = None  # (backend, x's shape, x's dtype, launch): see `product`

    def output(self, x, i: int):
        """Member i's columns of the product for x: from the pending outputs when they were
        computed for this very x and member i has not taken its own yet, else computed anew
        (the others' columns left pending). A taken output is dropped, and with the last the
        reference to x."""
        st = self.local
        p = st.pending  # [x, outputs, how many are left], or None
        if p is not None and p[0] is x:
            outputs = p[1]
            y = outputs[i]
            if y is not None:
                outputs[i] = None
                p[2] -= 1
                if p[2] == 0:
                    st.pending = None
                return y
        outputs = mx.split(self.product(x), self.splits, axis=-1)
        y, outputs[i] = outputs[i], None
        st.pending = [x, outputs, len(outputs) - 1]
        return y

    def product(self, x):
        """x times the concatenated weight. Inside the mode the first call for an activation
        shape and dtype goes through bi_rl.ops (every check, refusal and warning its own),
        and where the backend made one launch for it (its op's `launch_for`) the set keeps
        that launch; a later call with the same backend, shape and dtype runs it directly:
        the same kernel on the same arrays (the set's own, never replaced) as the op would
        launch, without its dispatch and signature lookups (bi_rl.fusion keeps the launches of
        grouped sets alike)."""
        if not _state.in_mode():
            return _matmul(x, self.arrays, self.quant)
        backend = backends.active()
        kept = self.kept
        if kept is not None and kept[0] is backend and kept[1] == x.shape and kept[2] == x.dtype:
            return kept[3](x, *self.arrays)
        y = _matmul(x, self.arrays, self.quant)
        op, rest = (
            ("linear", ()) if self.quant is None else ("quantized_matmul", (True, *self.quant))
        )
        launch_for = getattr(backend.ops.get(op), "launch_for", None)
        launch = None if launch_for is None else launch_for(x, *self.arrays, *rest)
        self.kept = None if launch is None else (backend, x.shape, x.dtype, launch)
        return y


class _Pending(threading.local):
    """Per thread: None, or the activation of the last product, its outputs not taken yet
    (None where taken) and how many are left, as one list (one attribute read a call)."""

    def __init__(self):
        self.pending = None


class Part(nn.Module):
    """A member of a concatenated set in its parent's place: its columns of the set's
    product. It keeps the member's own arrays (its slices) as its parameters, so the model's
    parameter tree reads as before."""

    def __init__(self, member: nn.Module, product: _Product, i: int):
        super().__init__()
        for k in product.keys:
            self[k] = member[k]
        # Plain instance attributes, set past nn.Module's __setattr__ (which would file the
        # tuple among the children, each read then a Python-level __getattr__): the call
        # below reads them on every forward.
        object.__setattr__(self, "_product", product)
        object.__setattr__(self, "_i", i)
        # (key, the array the set's product was built from) for each of its arrays
        object.__setattr__(self, "_own_kv", tuple(zip(product.keys, product.own[i], strict=True)))

    def __call__(self, x):
        get = self.get
        for k, a in self._own_kv:
            if get(k) is not a:  # its arrays were replaced since: its own product, as its
                product = self._product  # layer's would be
                return _matmul(x, tuple(self[k] for k in product.keys), product.quant)
        return self._product.output(x, self._i)


@contextmanager
def concatenated(model, enabled: bool = True, sets=SIBLINGS):
    """Rebuild `model`'s sibling projections of the kinds in `sets` (names as in
    bi_rl.fusion.SIBLINGS; every kind by default) as concatenated sets for the block (where
    `enabled`; yields how many sets), putting the members back in their parents on exit,
    also when the block raises. A set already rebuilt (its members are Parts) is left as it
    is."""
    swapped = []
    try:
        # (a stand-in model has no projections; with no kind of set named, nothing to walk)
        if enabled and sets and isinstance(model, nn.Module):
            for parent, names, members in list(sibling_slots(model)):
                if tuple(names) not in sets:
                    continue
                product = _Product(members)
                for i, (name, m) in enumerate(zip(names, members, strict=True)):
                    setattr(parent, name, Part(m, product, i))
                swapped.append((parent, names, members))
        yield len(swapped)
    finally:
        for parent, names, members in swapped:
            for name, m in zip(names, members, strict=True):
                setattr(parent, name, m)
