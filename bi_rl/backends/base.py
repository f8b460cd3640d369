"""What a backend is: a name and a table of batch-invariant implementations.

Each backend (cpu, cuda, metal) lives in its own module and builds one `Backend`. Its `ops`
table maps an op name to a function that computes that op so that row i of the output
depends only on row i of the input (and, for attention, only on that row's own valid keys).
An op missing from the table, or an implementation that raises `Unsupported` for the
arguments it was given, is where the backend cannot promise invariance: the dispatcher in
`bi_rl.ops` then raises `NotImplementedError` in strict mode, or warns once and falls back
to stock MLX.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

# The ops a backend may implement, with the signature each implementation takes.
#   linear(x, w, bias=None)                      x @ w.T (+ bias), w in the nn.Linear layout
#   grouped_linear(x, ws)                        [linear(x, w) for w in ws] with exactly those
#                                                bits: sibling projections of one activation
#                                                (q/k/v, gate/up) in one call; every w an
#                                                (N_i, K) weight of x's dtype, no bias
#   matmul(a, b)                                 a @ b, b two-dimensional
#   batched_matmul(a, b)                         a @ b, b of 3+ dimensions (batch broadcast)
#   addmm(c, a, b, alpha=1.0, beta=1.0)          alpha * (a @ b) + beta * c
#   quantized_matmul(x, w, scales, biases=None, transpose=True, group_size=None,
#                    bits=None, mode="affine")   mx.quantized_matmul's signature
#   grouped_quantized_matmul(x, members, group_size=None, bits=None)
#                                                [quantized_matmul(x, w, s, b, True, group_size,
#                                                bits) for (w, s, b) in members] with exactly
#                                                those bits: sibling affine-quantized projections
#                                                of one activation in one call
#     A grouped op's implementation may carry an attribute `launch_for(x, <the rest of its
#     arguments>)`: the one launch its call with arguments of those shapes and dtypes made, a
#     callable of (x, <the same arguments>) with that call's outputs, or None (none made, or
#     not called yet). bi_rl.fusion reruns it for a group's repeated calls (decode steps)
#     without the dispatch's checks and lookups. linear and quantized_matmul may carry one
#     too, for a projection of one (no bias): a callable of (x, w) or (x, w, scales, biases).
#   scaled_dot_product_attention(q, k, v, scale, mask=None, sinks=None, *, window=None,
#                                key_start=None)     window / key_start: see cuda/attention.py
#   gather_mm(a, b, lhs_indices=None, rhs_indices=None, sorted_indices=False)
#   gather_qmm(x, w, scales, biases=None, lhs_indices=None, rhs_indices=None, transpose=True,
#              group_size=None, bits=None, mode="affine", global_scale=None,
#              sorted_indices=False)                          mx.gather_qmm's signature
#   softmax(x, precise=False)                    mx.softmax over the last axis
OPS = (
    "linear",
    "grouped_linear",
    "matmul",
    "batched_matmul",
    "addmm",
    "quantized_matmul",
    "grouped_quantized_matmul",
    "scaled_dot_product_attention",
    "gather_mm",
    "gather_qmm",
    "softmax",
)


class Unsupported(Exception):
    """An implementation cannot make this call invariant; the message names the shape or dtype."""


@dataclass(frozen=True)
class Backend:
    name: str
    ops: Mapping[str, Callable] = field(default_factory=dict)
    # One line per op: how this backend makes it invariant (shown by bi-verify and the docs).
    how: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self):
        unknown = sorted(set(self.ops) - set(OPS))
        if unknown:
            raise ValueError(f"backend {self.name}: {', '.join(unknown)} are not ops ({OPS})")


def quant_params(group_size: int | None, bits: int | None) -> tuple[int, int]:
    """(group_size, bits) with mx.quantized_matmul's defaults for those left None (64, 4)."""
    return (64 if group_size is None else int(group_size)), (4 if bits is None else int(bits))
