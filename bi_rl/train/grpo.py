"""GRPO / PPO-style updates on one rollout batch, gated on the on-policy check.

A rollout batch (`RolloutBatch`) is a set of samples with the float32 logprob the sampler
gave each token (the behaviour policy p: from a rollout log, bi_rl.batch_generate or the
engine) and a reward per sample. `train_on_batch` does, in order:

  1. the gate: before any update, the trainer's logprobs at the current parameters are
     recomputed in full forward passes inside batch_invariant_mode (bi_rl.score.policy)
     and compared with the logged ones bit for bit. Any difference means the batch was not
     sampled from this policy: OffPolicyError names the first divergent token (sample,
     position, token, both values and bits) and no update is taken. With every bit equal,
     k3 is exactly 0 and every importance ratio exactly 1.
  2. advantages: group-relative (GRPO): A = (r - mean of the group) / (std of the group
     + 1e-4), a group being the samples of one prompt;
  3. `epochs` passes over the batch in minibatches of `minibatch_size` samples, each an
     optimizer step on the clipped surrogate

        L = -mean over samples of (token mean over the completion of
            min(ratio * A, clip(ratio, 1 - clip, 1 + clip) * A)),   ratio = exp(logp - p)

     where logp is value-exact (bi_rl.score.policy.policy_logprobs: the invariant value,
     the stock gradient) and p is always the logged logprob: the first update's ratios are
     exactly 1 (the gate proved it); later ones, after the parameters moved, are the PPO
     ratios against the behaviour policy, clipped.

`allow_off_policy` turns the gate's refusal into a report (the stock-MLX control run, where
the mismatch is the thing to measure). No reference-model KL term is used.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx.utils import tree_flatten

from bi_rl.logprobs import check_temperature
from bi_rl.mode import DEFAULT_MODE, check_mode
from bi_rl.rollout.schema import sample_label
from bi_rl.score.policy import PolicyBatch, invariant_logprobs, make_batch, policy_logprobs
from bi_rl.score.report import MismatchReport, compare
from bi_rl.score.scorer import Item

__all__ = [
    "OffPolicyError",
    "RolloutBatch",
    "UpdateConfig",
    "advantages",
    "check_on_policy",
    "train_on_batch",
]

ADVANTAGE_EPS = 1e-4
_ONE = np.float32(1.0).view(np.uint32)


@dataclass(frozen=True)
class UpdateConfig:
    """How a rollout batch is trained on; temperature is the sampler's (0 = greedy: T 1)."""

    temperature: float = 1.0
    clip: float = 0.2
    epochs: int = 1
    minibatch_size: int | None = None  # samples per optimizer step; None: the whole batch
    mode: str = DEFAULT_MODE
    allow_off_policy: bool = False

    def __post_init__(self):
        if not 0 < self.clip < 1:
            raise ValueError(f"clip must be in (0, 1), got {self.clip}")
        if self.epochs < 1:
            raise ValueError(f"epochs must be >= 1, got {self.epochs}")
        if self.minibatch_size is not None and self.minibatch_size < 1:
            raise ValueError(f"minibatch size must be >= 1, got {self.minibatch_size}")
        check_temperature(self.temperature)
        check_mode(self.mode)


@dataclass(frozen=True)
class RolloutBatch:
    """Samples with their logged logprob bits, GRPO groups, labels and rewards."""

    prompts: tuple[tuple[int, ...], ...]
    completions: tuple[tuple[int, ...], ...]
    logprob_bits: tuple[np.ndarray, ...]  # uint32, one per completion token
    groups: tuple[int, ...]  # samples of one group are compared with each other
    labels: tuple[str, ...]
    rewards: np.ndarray  # float64, one per sample

    @classmethod
    def from_samples(cls, samples: Sequence, rewards: Sequence[float]) -> RolloutBatch:
        """From engine Samples or log records (prompt_index, prompt_id, sample, tokens...)."""
        if len(samples) != len(rewards):
            raise ValueError(f"{len(samples)} samples vs {len(rewards)} rewards")
        if not samples:
            raise ValueError("a rollout batch needs at least one sample")
        return cls(
            prompts=tuple(tuple(s.prompt_tokens) for s in samples),
            completions=tuple(tuple(s.tokens) for s in samples),
            logprob_bits=tuple(np.array(s.logprob_bits, np.uint32) for s in samples),
            groups=tuple(s.prompt_index for s in samples),
            labels=tuple(sample_label(s.prompt_id, s.prompt_index, s.sample) for s in samples),
            rewards=np.array(rewards, np.float64),
        )

    def __len__(self) -> int:
        return len(self.prompts)

    @property
    def tokens(self) -> int:
        return sum(len(c) for c in self.completions)

    def items(self, idx: Sequence[int]) -> list[Item]:
        return [Item(self.prompts[i], self.completions[i]) for i in idx]


class OffPolicyError(RuntimeError):
    """The trainer's logprobs at the rollout policy differ from the logged ones."""

    def __init__(self, report: MismatchReport):
        self.report = report
        d = report.first_divergence
        super().__init__(
            f"off-policy batch, no update taken: {report.differing} of {report.tokens} tokens "
            f"differ between the rollout's logprobs and the trainer's (k3 max {report.k3_max:.3g}"
            f"); first at {d.label}, position {d.position} (token {d.token}): rollout "
            f"{d.rollout_logprob!r} (0x{d.rollout_bits:08x}), trainer {d.rescored_logprob!r} "
            f"(0x{d.rescored_bits:08x})"
        )


def advantages(rewards: np.ndarray, groups: Sequence[int]) -> np.ndarray:
    """Group-relative advantages (r - group mean) / (group std + eps), float32."""
    rewards = np.asarray(rewards, np.float64)
    groups = np.asarray(groups)
    out = np.zeros_like(rewards)
    for g in np.unique(groups):
        m = groups == g
        r = rewards[m]
        out[m] = (r - r.mean()) / (r.std() + ADVANTAGE_EPS)
    return out.astype(np.float32)


def _minibatches(n: int, size: int | None) -> list[list[int]]:
    size = n if size is None else size
    return [list(range(s, min(s + size, n))) for s in range(0, n, size)]


def _scatter(values: Sequence[np.ndarray], prompts, shape) -> mx.array:
    """Per-sample completion values (uint32 bits) placed at their (B, L) float32 positions."""
    out = np.zeros(shape, np.uint32)
    for i, (v, p) in enumerate(zip(values, prompts, strict=True)):
        out[i, len(p) - 1 : len(p) - 1 + len(v)] = v
    return mx.array(out.view(np.float32))


def _gather(lp: mx.array, prompts, completions) -> list[np.ndarray]:
    a = np.array(lp).view(np.uint32)
    return [
        a[i, len(p) - 1 : len(p) - 1 + len(c)]
        for i, (p, c) in enumerate(zip(prompts, completions, strict=True))
    ]


def check_on_policy(
    model, batch: RolloutBatch, cfg: UpdateConfig
) -> tuple[MismatchReport, list[mx.array]]:
    """The gate: (report, the trainer's (B, L) logprobs per minibatch). Raises OffPolicyError
    when a bit differs, unless cfg.allow_off_policy."""
    got_bits, invs = [], []
    for idx in _minibatches(len(batch), cfg.minibatch_size):
        pb = make_batch(batch.items(idx))
        inv = invariant_logprobs(model, pb, cfg.temperature, cfg.mode)
        invs.append(inv)
        got_bits += _gather(
            inv, [batch.prompts[i] for i in idx], [batch.completions[i] for i in idx]
        )
    report = compare(batch.logprob_bits, got_bits, tokens=batch.completions, labels=batch.labels)
    if report.differing and not cfg.allow_off_policy:
        raise OffPolicyError(report)
    return report, invs


def _update(model, opt, pb: PolicyBatch, old, inv, adv: np.ndarray, cfg: UpdateConfig) -> dict:
    a = mx.array(adv)[:, None]
    per_sample = mx.maximum(pb.mask.sum(axis=1), 1.0)
    seen = {}

    def loss_fn(m):
        lp = policy_logprobs(m, pb, cfg.temperature, invariant=inv, mode=cfg.mode)
        ratio = mx.exp(lp - old)
        seen["ratio"] = ratio
        clipped = mx.clip(ratio, 1 - cfg.clip, 1 + cfg.clip)
        surr = mx.minimum(ratio * a, clipped * a)
        return -((surr * pb.mask).sum(axis=1) / per_sample).mean()

    loss, grads = nn.value_and_grad(model, loss_fn)(model)
    grad_norm = mx.sqrt(sum((g * g).sum() for _, g in tree_flatten(grads)))
    opt.update(model, grads)
    mx.eval(model.parameters(), opt.state, loss, grad_norm)
    ratios = np.array(seen["ratio"])[np.array(pb.mask) > 0]
    outside = (ratios < 1 - cfg.clip) | (ratios > 1 + cfg.clip)
    return {
        "loss": float(loss),
        "grad_norm": float(grad_norm),
        "ratio_min": float(ratios.min()) if ratios.size else 1.0,
        "ratio_mean": float(ratios.mean()) if ratios.size else 1.0,
        "ratio_max": float(ratios.max()) if ratios.size else 1.0,
        "ratio_not_1": int((ratios.view(np.uint32) != _ONE).sum()),
        "clipped": int(outside.sum()),
        "tokens": int(ratios.size),
    }


def train_on_batch(model, opt, batch: RolloutBatch, cfg: UpdateConfig) -> dict:
    """Gate, then `epochs` x minibatch optimizer steps; the metrics of the batch.

    Returns {"check": the gate's report numbers, "updates": one dict per optimizer step}.
    """
    report, invs = check_on_policy(model, batch, cfg)
    adv = advantages(batch.rewards, batch.groups)
    updates = []
    for epoch in range(cfg.epochs):
        for k, idx in enumerate(_minibatches(len(batch), cfg.minibatch_size)):
            prompts = [batch.prompts[i] for i in idx]
            pb = make_batch(batch.items(idx))
            old = _scatter([batch.logprob_bits[i] for i in idx], prompts, pb.inputs.shape)
            if epoch == 0 and k == 0:
                inv = invs[0]  # the gate's forward pass: still the current parameters
            elif cfg.mode == "off":
                inv = None  # stock logprobs only
            else:
                inv = invariant_logprobs(model, pb, cfg.temperature, cfg.mode)
            row = _update(model, opt, pb, old, inv, adv[idx], cfg)
            updates.append({"epoch": epoch + 1, "minibatch": k + 1, **row})
    check = {
        "tokens": report.tokens,
        "differing": report.differing,
        "k3_mean": report.k3_mean,
        "k3_max": report.k3_max,
        "max_abs_diff": report.max_abs_diff,
    }
    return {"check": check, "updates": updates, "advantages": adv}
