"""Sibling projections grouped into one backend call inside batch_invariant_mode.

An attention block's q_proj, k_proj and v_proj read the same activation, and so do an MLP's
gate_proj and up_proj. `group_projections(model)` registers each such set as a group: plain
`nn.Linear` layers (no bias, one input width, one weight dtype), or `nn.QuantizedLinear`
layers (affine, no bias, one input width, bit width, group size and scale dtype). Inside the
mode, the first member called with an activation computes every member's product in one
`bi_rl.ops.grouped_linear` (or `grouped_quantized_matmul`) call and returns its own; each
sibling then called with that same array object takes its output from there instead of
computing it again.

Invariant: a grouped member returns exactly the bits of its own `ops.linear(x, weight)` (or
`ops.quantized_matmul(x, weight, scales, biases, ...)`) for its own x and arrays, whatever
its siblings are called with and in whatever order. The grouped ops' contract is those bits,
and a member computes its own product whenever the pending one may not be its: another
activation, an array or backend changed since, a sibling freed or given a bias, or its
output already taken.

On Hopper, decode-sized activations (up to 16 rows dense, 64 quantized) run a group in one
launch (bi_rl.backends.cuda.hopper.grouped_linear, hopper_qmm.grouped_quantized_matmul);
every other backend and shape runs the members one by one, where grouping only adds
bookkeeping. A group whose call made one launch keeps it (where the backend's grouped op
offers it: `launch_for`), and its next calls with an activation of the same shape and dtype,
on the same backend and the same member arrays, run that launch directly: at a decode step of
batch 1 the dispatch's checks and lookups are much of the host's time. The rollout engine
groups its model's projections for a run where that saves launches (`pays_off`: the CUDA
backend on Hopper, unless BI_RL_GROUP_PROJECTIONS=0), through `grouping`, which also
registers every other plain projection (o_proj, down_proj, an untied lm_head) as a group of
one: it runs its own `ops.linear` (`ops.quantized_matmul`), never a grouped op, and keeps the
launch that op made (where the backend's single op offers it) on the same terms. On exit
`grouping` removes only the groups it added. Other callers opt in, once the model is loaded:

    from bi_rl.fusion import group_projections, ungroup_projections
    group_projections(model)        # the number of groups registered
    ...                             # forwards inside batch_invariant_mode use them
    ungroup_projections(model)      # back to one ops.linear per layer

Outside the mode a grouped layer runs stock MLX, as any nn.Linear does.

The registry keeps no module alive: entries are keyed by id(module) (mlx's Module is a dict,
so it cannot be a dict key itself) beside a weak reference that is checked on every lookup,
and an entry removes itself when its module is freed. An attribute on the module would not
do: mlx stores attributes as the module's dict items, where a group of modules would become
extra children. Pending outputs are kept per thread and per group, and dropped, with their
reference to the activation, once every member has taken its own (or replaced by the group's
next call, if a member never came for its output).
"""

from __future__ import annotations

import os
import threading
import weakref
from contextlib import contextmanager

import mlx.nn as nn

from bi_rl import backends, ops

__all__ = [
    "GROUP_ENV",
    "SIBLINGS",
    "group_projections",
    "grouped",
    "grouping",
    "pays_off",
    "quantized_linear",
    "sibling_sets",
    "sibling_slots",
    "ungroup_projections",
]

# BI_RL_GROUP_PROJECTIONS=0 keeps the engine from grouping (pays_off): one launch a projection.
GROUP_ENV = "BI_RL_GROUP_PROJECTIONS"

# Child names of one parent module that read the same activation in mlx-lm's model families.
SIBLINGS = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))


class _Group:
    """One registered set of sibling projections, each held by a weak reference, or a single
    projection (`single`: a group of one, which keeps the launch of its own op); `checked`:
    the members' arrays (_arrays) when they were last found groupable alike, so that a call
    whose members still hold those very arrays skips the checks; `launch`: the launch the
    backend made for the last call through bi_rl.ops (_grouped_outputs, _single)."""

    __slots__ = ("checked", "launch", "members", "single")

    def __init__(self, modules):
        self.members = tuple(weakref.ref(m) for m in modules)
        self.single = len(self.members) == 1
        self.checked = None
        self.launch = None


class _Pending:
    """The outputs of one group's last grouped call on this thread that no member took yet."""

    __slots__ = ("backend", "left", "outputs", "weights", "x")

    def __init__(self, x, outputs, weights, backend):
        self.x = x  # the activation, compared by identity: a held array is never reused
        self.outputs = outputs  # one per member; None once taken
        self.weights = weights  # per member, the arrays they were computed from (_arrays)
        self.backend = backend
        self.left = len(outputs) - 1  # outputs not taken yet (the caller took its own)


# id(module) -> (weak reference to the module, its group, its index in the group). The mode's
# nn.Linear wrapper reads this dict object directly (one lookup per call), so it is only ever
# mutated, never rebound.
MEMBERS: dict[int, tuple[weakref.ref, _Group, int]] = {}
# Reentrant: a module freed by the garbage collector while this thread holds the lock runs
# `_forget`, which takes it again.
_lock = threading.RLock()


class _Local(threading.local):
    def __init__(self):
        self.pending: dict[_Group, _Pending] = {}


_local = _Local()


def _forget(key: int, ref: weakref.ref) -> None:
    """A registered module was freed: drop its entry (unless the id already names another)."""
    with _lock:
        entry = MEMBERS.get(key)
        if entry is not None and entry[0] is ref:
            del MEMBERS[key]


def _register(modules) -> _Group | None:
    """Register `modules` as one group; the new group, or None where they already are one."""
    with _lock:
        entries = [MEMBERS.get(id(m)) for m in modules]
        if all(e is not None for e in entries) and all(
            e[1] is entries[0][1] and e[1].members[i]() is m
            for i, (e, m) in enumerate(zip(entries, modules, strict=True))
        ):
            return None  # already this group
        group = _Group(modules)
        for i, m in enumerate(modules):
            key = id(m)
            MEMBERS[key] = (weakref.ref(m, lambda r, key=key: _forget(key, r)), group, i)
        return group


def grouped(module) -> tuple | None:
    """The registered group of `module` as a tuple of its live members, or None."""
    entry = MEMBERS.get(id(module))
    if entry is None or entry[0]() is not module:
        return None
    return tuple(r() for r in entry[1].members)


def _groupable(m) -> bool:
    # Exactly nn.Linear or nn.QuantizedLinear: subclasses and wrappers (LoRA) compute other
    # things.
    if type(m) is nn.Linear:
        return "bias" not in m and m["weight"].ndim == 2
    if type(m) is nn.QuantizedLinear:
        return m.mode == "affine" and "bias" not in m and "biases" in m and m["weight"].ndim == 2
    return False


def _kind(m) -> tuple:
    """What members of one group must share: the layer type, input width and dtypes (and a
    quantized layer's bit width and group size)."""
    w = m["weight"]
    if type(m) is nn.Linear:
        return (nn.Linear, w.shape[1], w.dtype)
    return (nn.QuantizedLinear, w.shape[1], w.dtype, m["scales"].dtype, m.bits, m.group_size)


def _arrays(m) -> tuple:
    """The arrays a member's product is computed from (compared by identity)."""
    if type(m) is nn.QuantizedLinear:
        return (m["weight"], m["scales"], m["biases"])
    return (m["weight"],)


def modules(model):
    """Every nn.Module in `model`'s tree, once each, `model` first: the modules
    `named_modules()` finds, without building their names (in a third of its time on a
    28-layer model; the scorer and the engine walk a model once a call)."""
    stack, seen = [model], set()
    while stack:
        x = stack.pop()
        if isinstance(x, dict):  # an nn.Module is a dict of its children
            if isinstance(x, nn.Module):
                if id(x) in seen:
                    continue
                seen.add(id(x))
                yield x
            stack.extend(reversed(list(x.values())))
        elif isinstance(x, (list, tuple)):
            stack.extend(reversed(x))


def sibling_slots(model):
    """(parent, names, members) for every set of sibling projections in `model` that can form
    a group, once each: the members are parent's children of those names."""
    for parent in modules(model):
        for names in SIBLINGS:
            if names[0] not in parent:
                continue
            members = [parent.get(n) for n in names]
            if not all(_groupable(m) for m in members):
                continue
            kind = _kind(members[0])
            if all(_kind(m) == kind for m in members):
                yield parent, names, members


def sibling_sets(model):
    """Every set of sibling projections in `model` that can form a group, once each."""
    for _, _, members in sibling_slots(model):
        yield members


def group_projections(model) -> int:
    """Register every set of sibling projections in `model` (SIBLINGS: plain nn.Linear or
    affine nn.QuantizedLinear, no bias, alike in input width, dtypes and quantization) as a
    group; returns how many groups it has.
    Calling it again keeps the groups already registered."""
    count = 0
    for members in sibling_sets(model):
        _register(members)
        count += 1
    return count


def ungroup_projections(model) -> int:
    """Remove the groups of every module in `model`; returns how many modules left a group."""
    removed = 0
    with _lock:
        for m in modules(model):
            entry = MEMBERS.get(id(m))
            if entry is not None and entry[0]() is m:
                del MEMBERS[id(m)]
                _local.pending.pop(entry[1], None)
                removed += 1
    return removed


def pays_off() -> bool:
    """Whether grouping saves launches on the active backend: the CUDA backend where its
    grouped_linear computes a decode step's group in one launch (Hopper), unless
    BI_RL_GROUP_PROJECTIONS=0. Elsewhere a group runs its members one by one, and grouping
    would only add bookkeeping."""
    if os.environ.get(GROUP_ENV, "") == "0" or backends.active().name != "cuda":
        return False
    from bi_rl.backends.cuda.gemm import groups_in_one_launch

    return groups_in_one_launch()


@contextmanager
def grouping(model, enabled: bool = True):
    """Group `model`'s sibling projections for the block (where `enabled`; yields how many
    groups it added), and register each other plain projection as a group of one, which
    keeps the launch of its own op (`_single`). On exit it removes the groups it added and no
    other: groups a caller registered before the block stay, also when the block raises."""
    added = []
    if enabled:
        for members in sibling_sets(model):
            group = _register(members)
            if group is not None:
                added.append(group)
        for m in modules(model):  # a plain projection in no group: a group of one
            group = _register([m]) if _groupable(m) and grouped(m) is None else None
            if group is not None:
                added.append(group)
    try:
        yield len(added)
    finally:
        with _lock:
            for group in added:
                for i, ref in enumerate(group.members):
                    m = ref()
                    if m is None:  # freed: _forget dropped its entry
                        continue
                    entry = MEMBERS.get(id(m))
                    if entry is not None and entry[1] is group and entry[2] == i:
                        del MEMBERS[id(m)]
                _local.pending.pop(group, None)


def quantized_linear(module, x):
    """An nn.QuantizedLinear's `module(x)` inside the mode, ungrouped: its own quantized_matmul
    (and bias). The mode's nn.QuantizedLinear wrapper calls it for a layer in no group."""
    y = ops.quantized_matmul(
        x,
        module["weight"],
        module["scales"],
        module.get("biases"),
        True,
        module.group_size,
        module.bits,
        module.mode,
    )
    return y + module["bias"] if "bias" in module else y


def _single(group: _Group, module, x, backend):
    """`module(x)` for a group of one: its own op's call (never a grouped op's, which might
    pick another kernel), whose launch it keeps as _grouped_outputs does, with the module's
    quantization besides; a later call matching all of it runs that launch directly, anything
    else goes through the op."""
    kept = group.launch
    if (
        kept is not None
        and kept[0] is backend
        and kept[2] == x.shape
        and kept[3] == x.dtype
        and _current(kept[1], module)
        and (kept[5] is None or kept[5] == (module.group_size, module.bits, module.mode))
    ):
        return kept[4](x, *kept[1])
    if "bias" in module:
        return _alone(module, x)
    if type(module) is nn.QuantizedLinear:
        quant = (module.group_size, module.bits, module.mode)
        op, args = "quantized_matmul", (module["weight"], module["scales"], module.get("biases"))
        rest = (True, *quant)
    else:
        quant, op, args, rest = None, "linear", (module["weight"],), ()
    y = getattr(ops, op)(x, *args, *rest)
    launch_for = getattr(backend.ops.get(op), "launch_for", None)
    launch = None if launch_for is None else launch_for(x, *args, *rest)
    group.launch = None if launch is None else (backend, args, x.shape, x.dtype, launch, quant)
    return y


def _alone(module, x):
    """`module(x)` inside the mode as an ungrouped layer computes it."""
    if type(module) is nn.QuantizedLinear:
        return quantized_linear(module, x)
    return ops.linear(x, module["weight"], module.get("bias"))


def _current(arrays: tuple, m) -> bool:
    """Whether `arrays` (from _arrays) are still m's own arrays, by identity, and m has no bias."""
    if arrays[0] is not m.get("weight") or "bias" in m:
        return False
    return len(arrays) == 1 or (arrays[1] is m.get("scales") and arrays[2] is m.get("biases"))


def _checked_arrays(group: _Group, members: list, module) -> tuple | None:
    """The members' arrays where they can be computed in one grouped call (all alive,
    groupable and alike), else None. The checks run when the arrays differ from the ones last
    checked."""
    checked = group.checked
    if checked is not None and all(
        m is not None and _current(a, m) for a, m in zip(checked, members, strict=True)
    ):
        return checked
    kind = _kind(module)
    if any(m is None or not _groupable(m) or _kind(m) != kind for m in members):
        group.checked = None
        return None
    group.checked = tuple(_arrays(m) for m in members)
    return group.checked


def _grouped_outputs(group: _Group, arrays: tuple, module, x, backend) -> list:
    """Every member's output for x from one grouped call through bi_rl.ops.

    Where the backend's grouped op made one launch for it (it then offers that launch through
    its `launch_for`), the group keeps the launch with what it was made for: the backend, x's
    shape and dtype and the members' very arrays. A later call that matches all of them runs
    the launch directly: the same kernel on the same arguments as the op would, without its
    dispatch, checks and signature lookups, which at a decode step of batch 1 are a large part
    of the host's time. Anything else, the first call included, goes through bi_rl.ops, so
    every check, refusal and warning stays the op's."""
    shape, dtype = x.shape, x.dtype
    kept = group.launch
    if (
        kept is not None
        and kept[0] is backend
        and kept[1] is arrays
        and kept[2] == shape
        and kept[3] == dtype
    ):
        return kept[4](x, kept[5])
    if type(module) is nn.QuantizedLinear:
        op, args, rest = "grouped_quantized_matmul", arrays, (module.group_size, module.bits)
    else:
        op, args, rest = "grouped_linear", [a[0] for a in arrays], ()
    outputs = getattr(ops, op)(x, args, *rest)
    launch_for = getattr(backend.ops.get(op), "launch_for", None)
    launch = None if launch_for is None else launch_for(x, args, *rest)
    group.launch = None if launch is None else (backend, arrays, shape, dtype, launch, args)
    return outputs


def call(entry: tuple, module, x):
    """`module(x)` inside the mode for a module with a MEMBERS entry: its pending output from
    the group's call on this same x, else a new grouped call whose other outputs stay pending
    (a group of one: `_single`)."""
    ref, group, i = entry
    if ref() is not module:  # a stale id (cannot outlive the module, but never trust it)
        return _alone(module, x)
    backend = backends.active()
    if group.single:
        return _single(group, module, x, backend)
    table = _local.pending
    p = table.get(group)
    if (
        p is not None
        and p.x is x
        and p.outputs[i] is not None
        and _current(p.weights[i], module)
        and p.backend is backend
    ):
        y = p.outputs[i]
        p.outputs[i] = None
        p.left -= 1
        if p.left == 0:
            del table[group]
        return y
    arrays = _checked_arrays(group, [r() for r in group.members], module)
    if arrays is None:
        table.pop(group, None)
        return _alone(module, x)
    # Arrays of another dtype or shape than x's are the grouped op's to handle: it then runs
    # the members one by one, with the single op's promotion and errors.
    outputs = _grouped_outputs(group, arrays, module, x, backend)
    y = outputs[i]
    outputs[i] = None
    table[group] = _Pending(x, outputs, arrays, backend)
    return y
