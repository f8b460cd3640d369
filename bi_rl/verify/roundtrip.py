"""`bi-verify --model DIR`: a short rollout + rescoring round trip on one model, stock as control.

The check a user runs on their own model before trusting its logs:
  1. prompts of random token ids (a fixed seed), with lengths on both sides of the model's
     sliding window when it has one (so decoding crosses and wraps it) and short ones;
  2. a rollout through the engine, `batch_size` sequences at a time (continuous batching,
     left padding, KV-cached decode), T = 1 with top-p 0.95, in the chosen mode;
  3. rescoring of every sample in full forward passes, `rescore_batch_size` at a time, in a
     shuffled order, in the same mode;
  4. every token's float32 logprob and logit-row fingerprint compared bit for bit;
  5. the same round trip on stock MLX (mode "off") as the control: where it differs, the mode
     is what makes the logs exact; where it does not (MLX's CPU backend), that is a finding.

The mode passes when nothing differs and no op was refused. A refusal (strict mode meeting
an op, dtype or layer it cannot make invariant) is reported with its message, which names
the layer and what to do.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np

from bi_rl.rollout.caches import layer_plan, mlx_lm_version
from bi_rl.rollout.engine import Engine, EngineConfig
from bi_rl.rollout.prompts import Prompt
from bi_rl.rollout.sampler import SamplerConfig, sequence_id
from bi_rl.score.scorer import Item, ScoreConfig, score, shuffled_order

__all__ = ["RoundTripConfig", "Side", "context_lengths", "prompt_lengths", "round_trip"]

SAMPLER = SamplerConfig(temperature=1.0, top_p=0.95, seed=20261201)


@dataclass(frozen=True)
class RoundTripConfig:
    prompts: int = 8
    new_tokens: int = 32
    batch_size: int = 8
    rescore_batch_size: int = 3
    max_prompt_length: int = 2048
    mode: str = "strict"
    control: bool = True
    context: int | None = None  # long-context check: every sample crosses this many keys

    def __post_init__(self):
        for name in ("prompts", "new_tokens", "batch_size", "rescore_batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.context is not None and self.context <= self.new_tokens:
            raise ValueError(
                f"context ({self.context}) must be longer than the new tokens ({self.new_tokens})"
            )
        if self.rescore_batch_size == self.batch_size:
            raise ValueError("the rescoring batch size must differ from the rollout's")


@dataclass
class Side:
    """One round trip (the mode's or the control's)."""

    mode: str
    tokens: int = 0
    differing: int = 0  # logprobs whose bits differ
    rows_differing: int = 0  # logit-row fingerprints that differ
    first: dict | None = None  # the first differing (prompt, position, rollout, rescored)
    error: str | None = None  # a refusal or a failure, one line
    refused: bool = False  # the error is strict mode refusing an op (NotImplementedError)

    @property
    def ok(self) -> bool:
        return self.error is None and self.tokens > 0 and self.differing == self.rows_differing == 0


@dataclass
class RoundTrip:
    family: str
    mlx_lm: str
    windows: list
    prompt_lengths: list
    config: dict
    mode: Side
    control: Side | None = None
    notes: list = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.mode.ok

    def to_json(self) -> dict:
        d = asdict(self)
        d["ok"] = self.ok
        return d


def prompt_lengths(windows, count: int, cap: int) -> list[int]:
    """`count` prompt lengths: short ones, then both sides of the smallest sliding window (the
    rollout then crosses and wraps it), else of 64 tokens; none above `cap`."""
    w = min((x for x in windows if x is not None), default=None)
    edge = w or 64
    base = [1, 5, 17, 33, edge - 1, edge, edge + 1, edge + 9, 2 * edge + 3, 7, 40, 100]
    return [max(1, min(base[i % len(base)], cap)) for i in range(count)]


def context_lengths(context: int, count: int, new_tokens: int) -> list[int]:
    """`count` prompt lengths whose samples all cross `context` keys while decoding: from
    context - 1 (crossed at the first new token) down to context - new_tokens + 1 (at the
    last), spread evenly."""
    span = new_tokens - 2
    return [context - 1 - (i * span) // max(1, count - 1) for i in range(count)]


def _one_line(e: BaseException) -> str:
    text = str(e).splitlines()[0] if str(e) else ""
    return text if isinstance(e, NotImplementedError) else f"{type(e).__name__}: {text}"


def _run(model, tokenizer, prompts, cfg: RoundTripConfig, mode: str) -> Side:
    side = Side(mode)
    eng = EngineConfig(
        n=1, max_tokens=cfg.new_tokens, stop_tokens=(), batch_size=cfg.batch_size, mode=mode
    )
    try:
        engine = Engine(model, tokenizer, SAMPLER, eng)
        samples = [s for step in engine.generate(prompts) for s in step.ready]
        items = [
            Item(s.prompt_tokens, tuple(s.tokens), sequence_id(s.prompt_id, s.sample))
            for s in samples
        ]
        order = shuffled_order(len(items), 1)
        sc = ScoreConfig(batch_size=cfg.rescore_batch_size, temperature=1.0, mode=mode)
        rescored = score(model, items, sc, order=order)
    except (NotImplementedError, RuntimeError, ValueError, FloatingPointError) as e:
        side.error, side.refused = _one_line(e), isinstance(e, NotImplementedError)
        return side
    for s, r in zip(samples, rescored, strict=True):
        a = np.asarray(s.logprob_bits, dtype=np.uint32)
        diff = np.flatnonzero(a != r.logprob_bits)
        side.tokens += len(a)
        side.differing += len(diff)
        fps = zip(s.fingerprints, r.fingerprints, strict=True)
        side.rows_differing += sum(x != y for x, y in fps)
        if len(diff) and side.first is None:
            j = int(diff[0])
            side.first = {
                "prompt": s.prompt_id,
                "position": j,
                "rollout": float(s.logprobs[j]),
                "rescored": float(r.logprobs[j]),
            }
    return side


def round_trip(model, tokenizer, cfg: RoundTripConfig = RoundTripConfig()) -> RoundTrip:
    """The round trip in `cfg.mode`, then (with cfg.control) on stock MLX."""
    import mlx.core as mx

    plan = layer_plan(model, "bi-verify --model")
    vocab = int(model(mx.array([[0]]))[0, -1].shape[-1])
    if cfg.context is None:
        lengths = prompt_lengths(plan.windows, cfg.prompts, cfg.max_prompt_length)
    else:
        lengths = context_lengths(cfg.context, cfg.prompts, cfg.new_tokens)
    rng = np.random.default_rng(0)
    prompts = [
        Prompt(f"r{i}", tuple(int(t) for t in rng.integers(0, vocab, n)))
        for i, n in enumerate(lengths)
    ]
    result = RoundTrip(
        family=plan.family,
        mlx_lm=mlx_lm_version(),
        windows=list(plan.windows),
        prompt_lengths=lengths,
        config=asdict(cfg),
        mode=_run(model, tokenizer, prompts, cfg, cfg.mode),
    )
    if cfg.control and cfg.mode != "off":
        result.control = _run(model, tokenizer, prompts, cfg, "off")
    w = min((x for x in plan.windows if x is not None), default=None)
    if w is not None and max(lengths) + cfg.new_tokens <= w:
        result.notes.append(
            f"the sliding window ({w} tokens) is longer than any prompt plus its new tokens: "
            "it was not crossed; raise --max-prompt-length or --new-tokens"
        )
    if plan.grouped_mask:
        result.notes.append(
            f"mlx-lm {result.mlx_lm}'s {plan.family} attention gets its batch mask with the "
            "query-group axis from bi-rl (its own fails at batch >= 2 with grouped-query heads)"
        )
    return result
