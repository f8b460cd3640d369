"""GEMM checks: a row of x @ W.T computed alone vs inside batches of every size.

For each batch size B the first B rows of one input go through the op together; every probe
row must carry exactly the bits it had when computed alone, also at the far end of a
reversed batch. Covers the nn.Linear layout with and without bias, general matmul on a
transposed view (as mlx-lm's `x @ W.T`), addmm, MLX affine quantized weights, and sibling
projections computed in one grouped call (a rollout's q/k/v and gate/up), whose every
member's row must carry the bits of that member's own op on the row alone.
"""

from __future__ import annotations

import mlx.core as mx

from bi_rl.verify.core import STOP_AT_FIRST, Check, bits, rand


def _probes(batches) -> list[int]:
    top = max(batches)
    rows = {0, 1, top - 1}
    for b in batches:
        rows.update({b - 1, b // 2})
    return sorted(r for r in rows if 0 <= r < top)


def row_invariance(check: Check, f, x: mx.array, batches, alone_f=None) -> Check:
    """Fill `check` by comparing f(x[:B]) rows with f(x[i:i+1]) for every B in batches
    (with alone_f(x[i:i+1]) where given: another op that must give a row alone those bits).

    A check that stops at its first difference (the stock control) walks the batch sizes
    from the largest down: a kernel switch sits somewhere between the smallest and the
    largest batch, so the largest meets it at once, and every size walked before it is one
    more shape the backend may compile at first use. Either order compares the same rows.
    Such a check also goes on past a batch size at which the op raises (stock kernels can
    fail at the largest): it only has to find one difference, which a smaller batch may
    show; the failure is named among the check's places and raised if none differs.
    """
    probes = _probes(batches)
    alone = {i: bits((alone_f or f)(x[i : i + 1]))[0] for i in probes}
    control = STOP_AT_FIRST.get()
    order = sorted(batches, reverse=True) if control else batches
    top = max(batches)
    raised = []

    def rows_of(b, a):
        try:
            return bits(f(a))
        except NotImplementedError:
            raise
        except Exception as e:
            if not control:
                raise
            raised.append(e)
            check.where.append(f"a batch of {b} raised {type(e).__name__}: {e}")
            return None

    for b in order:
        together = rows_of(b, x[:b])
        if together is None:
            continue
        for i in probes:
            if i < b:
                check.record(together[i], alone[i], f"row {i} in a batch of {b}")
    reversed_ = rows_of(top, x[:top][::-1])
    if reversed_ is not None:
        for i in probes:
            check.record(reversed_[top - 1 - i], alone[i], f"row {i} at position {top - 1 - i}")
    if raised:
        raise raised[0]
    return check


def gemm_check(ops, layout: str, dtype_name: str, dtype, k: int, n: int, batches, key: int):
    x = rand((max(batches), k), dtype, key)
    w = rand((n, k), dtype, key + 1, scale=k**-0.5)
    bias = rand((n,), dtype, key + 2)
    f = {
        "linear": lambda a: ops.linear(a, w),
        "linear+bias": lambda a: ops.linear(a, w, bias),
        "matmul x@W.T": lambda a: ops.matmul(a, w.T),
        "addmm": lambda a: ops.addmm(bias, a, w.T),
    }[layout]
    check = Check("gemm", f"{layout} K={k} N={n} B<={max(batches)}", dtype_name)
    return row_invariance(check, f, x, batches)


def quantized_check(
    ops, dtype_name: str, dtype, k: int, n: int, bits_: int, group: int, batches, key
):
    x = rand((max(batches), k), dtype, key)
    w = rand((n, k), dtype, key + 1, scale=k**-0.5)
    wq, scales, biases = mx.quantize(w, group_size=group, bits=bits_)
    f = lambda a: ops.quantized_matmul(a, wq, scales, biases, True, group, bits_, "affine")
    check = Check("quantized", f"{bits_}-bit g{group} K={k} N={n} B<={max(batches)}", dtype_name)
    return row_invariance(check, f, x, batches)


def grouped_check(
    ops, dtype_name: str, dtype, k: int, widths, batches, key: int, bits_=None, group=None
):
    """Sibling projections of widths `widths` through the grouped op (quantized where bits_
    is given): in batches of every size each member's rows carry the bits its own op gives
    the row alone (the members' outputs compared side by side)."""
    x = rand((max(batches), k), dtype, key)
    ws = [rand((n, k), dtype, key + 1 + i, scale=k**-0.5) for i, n in enumerate(widths)]
    if bits_ is None:
        grouped = lambda a: mx.concatenate(ops.grouped_linear(a, ws), axis=-1)
        single = lambda a: mx.concatenate([ops.linear(a, w) for w in ws], axis=-1)
        what = "linear"
    else:
        ms = [mx.quantize(w, group_size=group, bits=bits_) for w in ws]
        grouped = lambda a: mx.concatenate(ops.grouped_quantized_matmul(a, ms, group, bits_), -1)
        single = lambda a: mx.concatenate(
            [ops.quantized_matmul(a, *m, True, group, bits_, "affine") for m in ms], axis=-1
        )
        what = f"{bits_}-bit g{group}"
    shape = "+".join(map(str, widths))
    check = Check("grouped", f"{what} K={k} N={shape} B<={max(batches)}", dtype_name)
    return row_invariance(check, grouped, x, batches, alone_f=single)
