"""Timing two implementations of one computation fairly, in the same process and run.

Each sample evaluates the computation `inner` times back to back and synchronizes, so
launch-bound kernels are timed as a stream rather than one launch at a time; `inner` grows
until one sample lasts `min_sample_s`. The two sides alternate sample by sample (A B A B ...)
after a warm-up of both, so clock and thermal drift hit them equally (`compare_many`: any
number of sides, the order rotated every round). The figure reported is the median of the
samples, with the spread (interquartile range over median) beside it.

A sample builds all its calls' graphs before it evaluates any, so its time per call is the
graph building plus the larger of launching and running on the device. `build_s` times the
building alone, which says how much of a small call is host time.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import mlx.core as mx


@dataclass
class Timing:
    median_s: float  # per call
    spread: float  # interquartile range / median
    samples: int
    inner: int  # calls per sample

    def as_dict(self) -> dict:
        return asdict(self)


def _sample(fn: Callable[[], object], inner: int, evaluate: bool = True) -> float:
    start = time.perf_counter()
    outs = [fn() for _ in range(inner)]
    if evaluate:
        mx.eval(outs)
        mx.synchronize()
    return (time.perf_counter() - start) / inner


def build_s(fn: Callable[[], object], inner: int, samples: int = 15) -> float:
    """Median seconds per call to build `fn`'s graph, nothing evaluated, over `samples`
    samples of `inner` calls."""
    fn()
    return statistics.median(_sample(fn, inner, evaluate=False) for _ in range(samples))


def _calibrate(fn, min_sample_s: float, max_inner: int) -> int:
    inner = 1
    while inner < max_inner and _sample(fn, inner) * inner < min_sample_s:
        inner *= 2
    return inner


def _stats(samples: list[float], inner: int) -> Timing:
    q = statistics.quantiles(samples, n=4) if len(samples) >= 4 else [samples[0]] * 3
    med = statistics.median(samples)
    return Timing(med, (q[2] - q[0]) / med if med else 0.0, len(samples), inner)


def compare(
    ours: Callable[[], object],
    stock: Callable[[], object],
    samples: int = 15,
    warmup: int = 3,
    min_sample_s: float = 0.02,
    max_inner: int = 256,
) -> tuple[Timing, Timing]:
    """Median seconds per call of `ours` and `stock`, sampled alternately."""
    for _ in range(warmup):
        _sample(ours, 1)
        _sample(stock, 1)
    inner = max(
        _calibrate(ours, min_sample_s, max_inner), _calibrate(stock, min_sample_s, max_inner)
    )
    a, b = [], []
    for _ in range(samples):
        a.append(_sample(ours, inner))
        b.append(_sample(stock, inner))
    return _stats(a, inner), _stats(b, inner)


def compare_many(
    sides: dict[str, Callable[[], object]],
    samples: int = 9,
    warmup: int = 1,
    min_sample_s: float = 0.02,
    max_inner: int = 256,
) -> dict[str, Timing]:
    """Median seconds per call of each side, one sample of every side a round, the order
    rotated by one side every round (A B C, B C A, C A B, ...), every side with the largest
    inner count any side needs for a sample of min_sample_s."""
    names = list(sides)
    for _ in range(warmup):
        for name in names:
            _sample(sides[name], 1)
    inner = max(_calibrate(sides[n], min_sample_s, max_inner) for n in names)
    times: dict[str, list[float]] = {n: [] for n in names}
    for r in range(samples):
        k = r % len(names)
        for name in names[k:] + names[:k]:
            times[name].append(_sample(sides[name], inner))
    return {n: _stats(v, inner) for n, v in times.items()}
