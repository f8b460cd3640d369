"""Trainer-side policy logprobs: the invariant scorer's value, MLX's ordinary gradient.

The invariant path is forward-only (its kernels need no backward). A trainer still needs
gradients, so the policy logprob it optimises is built value-exact:

    logp = stop_gradient(invariant) + (stock - stop_gradient(stock))

`invariant` is the float32 logprob from a forward pass inside `batch_invariant_mode`,
bitwise what the rollout logged; `stock` is the same quantity from MLX's ordinary,
differentiable forward. For finite x, x - x is exactly +0 in IEEE arithmetic and y + 0 is
exactly y, so the value of `logp` is bitwise `invariant`, while its gradient is the stock
forward's gradient (the invariant term is a constant to autodiff). At the rollout policy
this makes the importance ratio exp(logp - logp_rollout) exactly 1 and every KL estimator
exactly 0, yet the policy gradient is the ordinary one. Where the stock logprob is not
finite (a token of probability 0 in float32), the correction term is taken as 0 there, so
no NaN is produced.

Both logprobs go through `bi_rl.logprobs.token_logprobs`, the function the sampler used.
Batches are right padded (`make_batch`); `mask` marks the completion positions. Only those
positions get a logprob: the model's output head runs on their rows alone where the family
allows it (bi_rl.score.scorer.head_pieces), so prompt and padding positions cost no
vocabulary-wide GEMM, no logits memory and no backward through either; the (B, L) arrays
hold 0 elsewhere.

Invariant kept: the value of `policy_logprobs` at a row depends only on that row (it is the
invariant scorer's); the gradient is whatever MLX's stock path gives.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import mlx.core as mx
import numpy as np

from bi_rl.logprobs import token_logprobs
from bi_rl.mode import named_mode, suspended
from bi_rl.score.queued import queued_layers
from bi_rl.score.scorer import PAD_ID, Item, head_pieces, piece_spans

__all__ = [
    "PolicyBatch",
    "invariant_logprobs",
    "make_batch",
    "policy_logprobs",
    "stock_logprobs",
    "value_exact",
]


@dataclass(frozen=True)
class PolicyBatch:
    """Right-padded (B, L) inputs, next-token targets and a float32 completion mask."""

    inputs: mx.array
    targets: mx.array
    mask: mx.array

    @property
    def tokens(self) -> int:
        return int(self.mask.sum().item())


def make_batch(items: Sequence[Item]) -> PolicyBatch:
    """Inputs prompt + completion[:-1]; position p predicts token p + 1; mask = completion."""
    seqs, tgts, masks = [], [], []
    for it in items:
        if not it.prompt:
            raise ValueError("every sample needs a non-empty prompt")
        full = list(it.prompt) + list(it.completion)
        seqs.append(full[:-1])
        tgts.append(full[1:])
        masks.append([0.0] * (len(it.prompt) - 1) + [1.0] * len(it.completion))
    longest = max(len(s) for s in seqs)
    pad = lambda rows, v: [r + [v] * (longest - len(r)) for r in rows]
    return PolicyBatch(
        inputs=mx.array(pad(seqs, PAD_ID), dtype=mx.int32),
        targets=mx.array(pad(tgts, PAD_ID), dtype=mx.int32),
        mask=mx.array(pad(masks, 0.0), dtype=mx.float32),
    )


def _masked_logprobs(model, batch: PolicyBatch, temperature: float) -> mx.array:
    """(B, L) float32: the targets' logprobs at the mask's positions, 0 elsewhere; the head
    runs on the mask's rows (row-major) and the values go back to their places by a gather
    (differentiable), where every position off the mask reads one appended zero."""
    mask = np.array(batch.mask) > 0
    n = int(mask.sum())
    if n == 0:
        return mx.zeros(batch.mask.shape, mx.float32)
    rows = np.flatnonzero(mask)
    back = np.full(mask.size, n, dtype=np.int32)
    back[rows] = np.arange(n, dtype=np.int32)
    rows = mx.array(rows.astype(np.int32))
    targets = batch.targets.reshape(-1)[rows]
    pieces, _ = head_pieces(model, batch.inputs, None, rows)  # each within the head's bound
    lps = [token_logprobs(p, targets[span], temperature) for p, span in piece_spans(pieces)]
    lp = mx.concatenate([*lps, mx.zeros((1,), lps[0].dtype)])
    return lp[mx.array(back)].reshape(batch.mask.shape)


def stock_logprobs(model, batch: PolicyBatch, temperature: float = 1.0) -> mx.array:
    """(B, L) float32 logprobs of the targets at the completion positions (0 elsewhere) from
    MLX's ordinary (differentiable) forward, computed outside batch_invariant_mode even when
    called inside it."""
    with suspended():
        return _masked_logprobs(model, batch, temperature)


def invariant_logprobs(
    model,
    batch: PolicyBatch,
    temperature: float = 1.0,
    mode: str = "strict",
    *,
    queue_layers: bool = True,
) -> mx.array:
    """(B, L) float32 logprobs at the completion positions (0 elsewhere) from a forward pass
    inside batch_invariant_mode, evaluated.

    Forward-only: call it outside any gradient transformation (or pass its result to
    `policy_logprobs`), since invariant kernels need not have a backward pass. queue_layers:
    queue each decoder layer on the device as it is built (bi_rl.score.queued; the same
    bits), which MLX allows only outside a transformation (`policy_logprobs` turns it off).
    """
    with named_mode(mode), queued_layers(model, queue_layers):
        out = _masked_logprobs(model, batch, temperature)
        mx.eval(out)
    return mx.stop_gradient(out)


def value_exact(invariant: mx.array, stock: mx.array) -> mx.array:
    """stop_gradient(invariant) + (stock - stop_gradient(stock)): value of one, grad of other."""
    correction = stock - mx.stop_gradient(stock)
    correction = mx.where(mx.isfinite(stock), correction, mx.zeros_like(correction))
    return mx.stop_gradient(invariant) + correction


def policy_logprobs(
    model,
    batch: PolicyBatch,
    temperature: float = 1.0,
    *,
    invariant: mx.array | None = None,
    mode: str = "strict",
) -> mx.array:
    """Value-exact policy logprobs for a loss under mx.grad / nn.value_and_grad.

    invariant: the (B, L) invariant logprobs at the current parameters, from
    `invariant_logprobs` (computed here, under stop_gradient, when None). mode "off" returns
    the stock logprobs unchanged: the usual trainer, for contrast.
    """
    stock = stock_logprobs(model, batch, temperature)
    if mode == "off":
        return stock
    if invariant is None:  # (maybe under mx.grad, where mx.async_eval is refused)
        invariant = invariant_logprobs(model, batch, temperature, mode, queue_layers=False)
    if invariant.shape != stock.shape:
        raise ValueError(f"invariant logprobs {invariant.shape} vs batch {stock.shape}")
    return value_exact(invariant, stock)
