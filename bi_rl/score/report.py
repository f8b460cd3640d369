"""Mismatch and KL report: logged (rollout) logprobs against rescored (trainer) logprobs.

Equality is decided on bit patterns: a token counts as equal when the float32 logprob the
rollout logged and the one the scorer recomputed have the same 32 bits, and a logit row as
equal when the two 64-bit fingerprints match. Everything else is a statistic of the gap,
computed in float64 from the float32 values.

Direction. p is the rollout policy (the sampler that drew every token), q the rescoring
policy (the trainer's forward pass). Tokens are samples from p, so, per token, with
d = log p - log q and r = q / p = exp(-d), the Schulman estimators of KL(p || q) are

    k1 = log p - log q = d                  unbiased, can be negative
    k2 = 0.5 (log p - log q)^2 = d^2 / 2    biased, low variance, >= 0
    k3 = (r - 1) - log r = expm1(-d) + d    unbiased, >= 0

reported as token means and maxima. verl logs the same quantities as `rollout_corr/kl`
(k1 mean) and `rollout_corr/k3_kl` (k3 mean), KL(rollout || training); TRL as
`sampling/sampling_logp_difference/{mean,max}` (|d|) and
`sampling/importance_sampling_ratio/{min,mean,max}` (r, before clipping). `aliases()` gives
those names. When every token is bitwise equal, d is exactly 0 and so is every estimator.

Invariant kept: the report is a pure function of the two sets of bit patterns.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np

__all__ = ["Divergence", "MismatchReport", "compare", "format_table", "kl_estimators"]


@dataclass(frozen=True)
class Divergence:
    """The first token (in sample order, then position) whose logged and rescored values differ."""

    sample: int  # index of the sample in the compared sequence (log record order)
    position: int  # completion position
    label: str  # what names the sample for a reader, e.g. "prompt p3 (index 3), sample 1"
    token: int | None
    rollout_logprob: float
    rescored_logprob: float
    rollout_bits: int
    rescored_bits: int
    rollout_fingerprint: int | None = None
    rescored_fingerprint: int | None = None


@dataclass(frozen=True)
class MismatchReport:
    samples: int
    tokens: int
    equal: int  # tokens whose logprob bits are equal
    differing: int
    samples_differing: int
    fingerprints_compared: int
    fingerprints_equal: int
    first_divergence: Divergence | None  # first logprob whose bits differ
    first_fingerprint_divergence: Divergence | None
    max_abs_diff: float  # max |log p - log q|
    mean_abs_diff: float
    k1_mean: float
    k1_max: float
    k2_mean: float
    k2_max: float
    k3_mean: float
    k3_max: float
    ratio_min: float  # r = q / p
    ratio_mean: float
    ratio_max: float
    prob_diff_max: float  # max |p - q| in probability

    @property
    def identical(self) -> bool:
        """Every logprob bitwise equal, and every fingerprint compared equal."""
        return self.differing == 0 and self.fingerprints_equal == self.fingerprints_compared

    def aliases(self) -> dict:
        """The same numbers under the metric names verl and TRL users know."""
        return {
            "rollout_corr/kl": self.k1_mean,
            "rollout_corr/k3_kl": self.k3_mean,
            "training/rollout_probs_diff_max": self.prob_diff_max,
            "sampling/sampling_logp_difference/mean": self.mean_abs_diff,
            "sampling/sampling_logp_difference/max": self.max_abs_diff,
            "sampling/importance_sampling_ratio/min": self.ratio_min,
            "sampling/importance_sampling_ratio/mean": self.ratio_mean,
            "sampling/importance_sampling_ratio/max": self.ratio_max,
        }

    def to_json(self) -> dict:
        d = asdict(self)
        d["identical"] = self.identical
        d["direction"] = "KL(rollout || rescored): tokens sampled from the rollout policy p"
        d["aliases"] = self.aliases()
        return d


def kl_estimators(log_p: np.ndarray, log_q: np.ndarray) -> dict[str, np.ndarray]:
    """Per-token k1, k2, k3 and r = q/p for tokens sampled from p (float64)."""
    d = np.asarray(log_p, np.float64) - np.asarray(log_q, np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        return {"k1": d, "k2": 0.5 * d * d, "k3": np.expm1(-d) + d, "ratio": np.exp(-d)}


def _stat(fn, x: np.ndarray) -> float:
    return float(fn(x)) if x.size else 0.0


def compare(
    rollout_bits: Sequence[np.ndarray],
    rescored_bits: Sequence[np.ndarray],
    *,
    rollout_fingerprints: Sequence[Sequence[int]] | None = None,
    rescored_fingerprints: Sequence[Sequence[int]] | None = None,
    tokens: Sequence[Sequence[int]] | None = None,
    labels: Sequence[str] | None = None,
) -> MismatchReport:
    """Compare per-sample uint32 logprob bit patterns (and fingerprints, where given)."""
    if len(rollout_bits) != len(rescored_bits):
        raise ValueError(f"{len(rollout_bits)} rollout samples vs {len(rescored_bits)} rescored")
    label = (lambda i: labels[i]) if labels is not None else (lambda i: f"sample {i}")
    first = first_fp = None
    equal = samples_differing = fp_compared = fp_equal = 0
    all_p, all_q = [], []
    for i, (a, b) in enumerate(zip(rollout_bits, rescored_bits, strict=True)):
        a = np.asarray(a, np.uint32)
        b = np.asarray(b, np.uint32)
        if a.shape != b.shape:
            raise ValueError(f"{label(i)}: {a.size} logged tokens vs {b.size} rescored")
        same = a == b
        equal += int(same.sum())
        all_p.append(a.view(np.float32))
        all_q.append(b.view(np.float32))
        fa = fb = None
        if rollout_fingerprints is not None and rescored_fingerprints is not None:
            fa, fb = list(rollout_fingerprints[i]), list(rescored_fingerprints[i])
            fp_compared += len(fa)
            fp_same = [x == y for x, y in zip(fa, fb, strict=True)]
            fp_equal += sum(fp_same)
            if first_fp is None and not all(fp_same):
                j = fp_same.index(False)
                first_fp = _divergence(i, j, label(i), tokens, a, b, fa, fb)
        if not same.all():
            samples_differing += 1
            if first is None:
                j = int(np.argmin(same))
                first = _divergence(i, j, label(i), tokens, a, b, fa, fb)
    p = np.concatenate(all_p) if all_p else np.zeros(0, np.float32)
    q = np.concatenate(all_q) if all_q else np.zeros(0, np.float32)
    est = kl_estimators(p, q)
    absd = np.abs(est["k1"])
    with np.errstate(over="ignore", invalid="ignore"):
        prob_diff = np.abs(np.exp(p.astype(np.float64)) - np.exp(q.astype(np.float64)))
    return MismatchReport(
        samples=len(rollout_bits),
        tokens=int(p.size),
        equal=equal,
        differing=int(p.size) - equal,
        samples_differing=samples_differing,
        fingerprints_compared=fp_compared,
        fingerprints_equal=fp_equal,
        first_divergence=first,
        first_fingerprint_divergence=first_fp,
        max_abs_diff=_stat(np.max, absd),
        mean_abs_diff=_stat(np.mean, absd),
        k1_mean=_stat(np.mean, est["k1"]),
        k1_max=_stat(np.max, est["k1"]),
        k2_mean=_stat(np.mean, est["k2"]),
        k2_max=_stat(np.max, est["k2"]),
        k3_mean=_stat(np.mean, est["k3"]),
        k3_max=_stat(np.max, est["k3"]),
        ratio_min=_stat(np.min, est["ratio"]) if p.size else 1.0,
        ratio_mean=_stat(np.mean, est["ratio"]) if p.size else 1.0,
        ratio_max=_stat(np.max, est["ratio"]) if p.size else 1.0,
        prob_diff_max=_stat(np.max, prob_diff),
    )


def _divergence(i, j, label, tokens, a, b, fa, fb) -> Divergence:
    return Divergence(
        sample=i,
        position=j,
        label=label,
        token=int(tokens[i][j]) if tokens is not None else None,
        rollout_logprob=float(a[j : j + 1].view(np.float32)[0]),
        rescored_logprob=float(b[j : j + 1].view(np.float32)[0]),
        rollout_bits=int(a[j]),
        rescored_bits=int(b[j]),
        rollout_fingerprint=fa[j] if fa is not None else None,
        rescored_fingerprint=fb[j] if fb is not None else None,
    )


def _num(x: float) -> str:
    if x == 0:
        return "0" if math.copysign(1.0, x) > 0 else "-0"
    return f"{x:.6g}"


def format_table(report: MismatchReport) -> str:
    """A readable, aligned summary of the report."""
    r = report
    pct = 100.0 * r.equal / r.tokens if r.tokens else 100.0
    rows = [
        ("samples", f"{r.samples} ({r.samples_differing} with a differing token)"),
        ("tokens compared", str(r.tokens)),
        ("bitwise equal", f"{r.equal} ({pct:.2f}%)"),
        ("differing", str(r.differing)),
        ("logit rows equal", f"{r.fingerprints_equal} / {r.fingerprints_compared} (fingerprints)"),
        ("max |d logprob|", _num(r.max_abs_diff)),
        ("mean |d logprob|", _num(r.mean_abs_diff)),
        ("k1 mean / max", f"{_num(r.k1_mean)} / {_num(r.k1_max)}"),
        ("k2 mean / max", f"{_num(r.k2_mean)} / {_num(r.k2_max)}"),
        ("k3 mean / max", f"{_num(r.k3_mean)} / {_num(r.k3_max)}"),
        (
            "ratio q/p min/mean/max",
            f"{_num(r.ratio_min)} / {_num(r.ratio_mean)} / {_num(r.ratio_max)}",
        ),
    ]
    for name, d in (
        ("first divergence", r.first_divergence),
        ("first row divergence", r.first_fingerprint_divergence),
    ):
        if d is not None:
            tok = "" if d.token is None else f" token {d.token}:"
            val = (
                f"{d.label}, position {d.position}:{tok} rollout {d.rollout_logprob!r} "
                f"(0x{d.rollout_bits:08x}) vs rescored {d.rescored_logprob!r} "
                f"(0x{d.rescored_bits:08x})"
            )
            if name == "first row divergence":
                fa, fb = d.rollout_fingerprint, d.rescored_fingerprint
                val = f"{d.label}, position {d.position}: fingerprint 0x{fa:016x} vs 0x{fb:016x}"
            rows.append((name, val))
    width = max(len(k) for k, _ in rows)
    lines = [f"  {k.ljust(width)}  {v}" for k, v in rows]
    lines.append("  (p = rollout, q = rescored; k1..k3 estimate KL(p || q) per token)")
    return "\n".join(lines)
