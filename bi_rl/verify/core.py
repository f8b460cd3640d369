"""What a verification check is, and the two op sets a sweep runs: the mode's and stock MLX's.

A check computes the same rows in different company (alone, in a batch, padded, behind a
grown cache, as a decode step or a prefill chunk) and counts the output elements whose raw
bit patterns differ from the row computed alone. Zero is invariance; anything else is not.
"""

from __future__ import annotations

import contextvars
from dataclasses import asdict, dataclass, field
from types import SimpleNamespace

import mlx.core as mx
import numpy as np

from bi_rl import _stock, ops
from bi_rl.backends import composed


@dataclass
class Check:
    family: str  # "gemm", "quantized", "attention", "grouped"
    case: str  # what was compared, e.g. "linear+bias K=127 N=65"
    dtype: str
    compared: int = 0  # output elements compared
    differing: int = 0  # of those, how many had different bits
    status: str = "ok"  # ok | variant | unsupported | error
    detail: str = ""  # first difference, or the error
    where: list = field(default_factory=list)  # up to 5 places that differed
    stopped: bool = False  # ended at its first difference (see FirstDifference)

    def record(self, got: np.ndarray, want: np.ndarray, where: str) -> None:
        """Compare two bit-pattern arrays of one row set; remember where they differ."""
        n = int((got != want).sum())
        self.compared += int(want.size)
        if n:
            self.differing += n
            self.status = "variant"
            if len(self.where) < 5:
                self.where.append(f"{where}: {n}/{want.size}")
            self.detail = self.detail or where
            if STOP_AT_FIRST.get():
                self.stopped = True
                raise FirstDifference(self)

    def as_dict(self) -> dict:
        return asdict(self)


class FirstDifference(Exception):
    """Ends a check at its first differing comparison when STOP_AT_FIRST is set.

    A control op set only has to show that it varies: once one row differs, the rest of the
    check would only count more differences (and on some backends stock kernels take a second
    a call at the shapes a check walks through). The check travels with the exception.
    """

    def __init__(self, check: Check):
        super().__init__(check.detail)
        self.check = check


# Set while a check runs through an op set whose `first_difference` is true (sweep.run_one).
STOP_AT_FIRST: contextvars.ContextVar[bool] = contextvars.ContextVar("stop_at_first", default=False)


def bits(x: mx.array) -> np.ndarray:
    """Raw bit patterns: uint32 for float32, uint16 for float16 / bfloat16, integers as they are."""
    if x.dtype in (mx.float16, mx.bfloat16):
        return np.array(x.view(mx.uint16))
    if x.dtype == mx.float32:
        return np.array(x).view(np.uint32)
    return np.array(x)


def f64(x: mx.array) -> np.ndarray:
    """x as float64, through float32 (exact for every MLX float type): for references."""
    return np.array(x.astype(mx.float32), dtype=np.float64)


def relerr(out: mx.array, ref: np.ndarray) -> float:
    """Accuracy: relative Frobenius error of out against a float64 reference."""
    return float(np.linalg.norm(f64(out) - ref) / np.linalg.norm(ref))


def rand(shape, dtype, key: int, scale: float = 1.0) -> mx.array:
    return (mx.random.normal(shape, key=mx.random.key(key)) * scale).astype(dtype)


# The op sets a sweep runs. MODE goes through the active backend's invariant ops, strictly
# (an unsupported case raises NotImplementedError and is reported as such); STOCK is MLX.
# first_difference: a check through the op set ends at its first differing row. The mode's
# checks always run to the end (every element is counted); the stock control's stop early.
MODE = SimpleNamespace(
    name="bi-rl mode",
    first_difference=False,
    linear=ops.linear,
    matmul=ops.matmul,
    addmm=ops.addmm,
    quantized_matmul=ops.quantized_matmul,
    grouped_linear=ops.grouped_linear,
    grouped_quantized_matmul=ops.grouped_quantized_matmul,
    sdpa=ops.scaled_dot_product_attention,
)


STOCK = SimpleNamespace(
    name="stock MLX",
    first_difference=True,
    linear=_stock.linear,
    matmul=_stock.matmul,
    addmm=_stock.addmm,
    quantized_matmul=_stock.quantized_matmul,
    grouped_linear=lambda x, ws: [_stock.linear(x, w) for w in ws],
    grouped_quantized_matmul=lambda x, ms, group, bits: [
        _stock.quantized_matmul(x, *m, transpose=True, group_size=group, bits=bits) for m in ms
    ],
    sdpa=composed.stock_attention,  # window and ring composed from stock ops
)

DTYPES = {"float32": mx.float32, "float16": mx.float16, "bfloat16": mx.bfloat16}
