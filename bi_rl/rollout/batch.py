"""The decode batch of the rollout engine: rows, their KV caches, and how rows join and leave.

Layout (mlx-lm's BatchKVCache, one per layer): row r's keys sit at the right end of the
cache, after `pad[r]` slots of left padding that the attention mask hides; all rows share
the write position `idx`. Everything here is bookkeeping the host already knows, kept beside
the device arrays (`pad`, `idx`), so that no operation reads a device value back and the
device never waits for the host:

  - `Prefill`: a group of new sequences, prefilled right-padded in chunks of a fixed size
    (one chunk per `advance`, so a long prompt shares the device with the running decode
    steps), then rolled to left padding; a prompt shared by several samples is prefilled
    once and its cache rows repeated;
  - `Batch.join`: appends a prefilled group (mlx-lm's `extend`: both sides right-aligned to
    the longer history, the shorter one padded on the left);
  - `Batch.compact`: drops finished rows with one gather per cache array, then trims the
    left padding every row has. Finished rows may stay in the batch until then: their
    outputs are ignored, and keeping them costs one row of decode work, while compacting
    copies the whole cache.

Invariant kept: a row's keys, values and positions are its own whatever joins or leaves;
padding and neighbours are hidden by the mask and cannot change its bits under the
invariant kernels (what may vary is the layout, never a row's content).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import mlx.core as mx

from bi_rl.mode import named_mode
from bi_rl.rollout.caches import batch_caches

__all__ = ["Batch", "Prefill"]


def _mark(caches: list, pad: list[int]) -> None:
    """Tell each cache whether any row is padded (EngineBatchKVCache drops an unneeded mask)."""
    padded = max(pad, default=0) > 0
    for c in caches:
        c.padded = padded


def _gather(caches: list, rows: list[int], pad: list[int]) -> list[int]:
    """Keep `rows` (indices, repeats allowed) of every cache; returns their padding after
    the common left padding is trimmed (mlx-lm's BatchKVCache.filter, without its readback
    of the padding from the device)."""
    idx = mx.array(rows, dtype=mx.int32)
    new_pad = [pad[r] for r in rows]
    trim = min(new_pad)
    for c in caches:
        if c.keys is not None:
            c.keys, c.values = c.keys[idx], c.values[idx]
        c.offset, c.left_padding = c.offset[idx], c.left_padding[idx]
        if trim > 0:
            if c.keys is not None:
                c.keys = c.keys[..., trim:, :]
                c.values = c.values[..., trim:, :]
            c._idx -= trim
            c.left_padding = c.left_padding - trim
    new_pad = [p - trim for p in new_pad]
    _mark(caches, new_pad)
    return new_pad


@dataclass
class Prefill:
    """A group of sequences being prefilled: every prompt token but the last goes into the
    caches; the last is each row's first decode input (`last`)."""

    rows: list  # the group's sequences, in admission order
    prompts: list[list[int]]  # distinct prompts, all but their last token
    fan: list[int]  # row i uses distinct prompt fan[i]
    last: list[int]  # row i's first decode input
    caches: list
    chunk: int
    start: int = 0
    pad: list[int] = field(default_factory=list)

    @classmethod
    def open(cls, rows: list, prompts: list[tuple[int, tuple[int, ...]]], plan, chunk: int):
        """rows[i] decodes after prompts[i] = (key, tokens); rows with one key share a prefill.
        plan: the model's bi_rl.rollout.caches.LayerPlan."""
        uniq: dict[int, int] = {}
        fan = [uniq.setdefault(k, len(uniq)) for k, _ in prompts]
        distinct: list = [None] * len(uniq)
        for (_, p), i in zip(prompts, fan, strict=True):
            distinct[i] = list(p[:-1])
        caches = batch_caches(plan, [0] * len(distinct))
        longest = max(len(p) for p in distinct)
        lengths = [len(p) for p in distinct]
        padding = [longest - n for n in lengths]
        if max(padding) > 0:
            for c in caches:
                c.prepare(lengths=lengths, right_padding=padding)
        _mark(caches, padding)
        last = [p[-1] for _, p in prompts]
        return cls(rows, distinct, fan, last, caches, chunk, pad=padding)

    @property
    def longest(self) -> int:
        return max(len(p) for p in self.prompts)

    @property
    def done(self) -> bool:
        return self.start >= self.longest

    def advance(self, model, mode: str) -> int:
        """Queue the next chunk on the device; returns the prompt tokens it holds."""
        s, e = self.start, min(self.start + self.chunk, self.longest)
        tokens = mx.array([p[s:e] + [0] * (e - len(p[s:e]) - s) for p in self.prompts])
        with named_mode(mode):
            model(tokens.astype(mx.int32), cache=self.caches)
        self.start = e
        if self.done and max(self.pad) > 0:
            for c in self.caches:
                c.finalize()  # roll each row's padding to its left
        mx.async_eval([c.state for c in self.caches])
        return sum(max(0, min(len(p), e) - s) for p in self.prompts)


@dataclass
class Batch:
    """The rows decoding together (finished ones until the next compaction), in cache order."""

    rows: list = field(default_factory=list)
    caches: list | None = None
    pad: list[int] = field(default_factory=list)  # left padding of each row
    y: mx.array | None = None  # each row's next decode input (lazy)

    @property
    def live(self) -> int:
        return sum(not r.done for r in self.rows)

    @property
    def dead(self) -> int:
        return len(self.rows) - self.live

    def join(self, group: Prefill) -> None:
        """Append a prefilled group's rows."""
        caches, pad = group.caches, list(group.pad)
        if group.fan != list(range(len(group.prompts))):
            pad = _gather(caches, group.fan, pad)
        last = mx.array(group.last, dtype=mx.int32)
        if self.caches is None:
            self.caches, self.pad, self.y = caches, pad, last
        else:
            ours, theirs = self.caches[0]._idx, caches[0]._idx
            top = max(ours, theirs)
            for c, o in zip(self.caches, caches, strict=True):
                c.extend(o)  # right-aligns both at the longer history
            self.pad = [p + top - ours for p in self.pad] + [p + top - theirs for p in pad]
            _mark(self.caches, self.pad)
            self.y = mx.concatenate([self.y, last])
        self.rows += group.rows

    def compact(self) -> None:
        """Drop the finished rows from the caches and the inputs."""
        keep = [i for i, r in enumerate(self.rows) if not r.done]
        if len(keep) == len(self.rows):
            return
        if not keep:
            self.rows, self.caches, self.pad, self.y = [], None, [], None
            return
        self.pad = _gather(self.caches, keep, self.pad)
        self.y = self.y[mx.array(keep, dtype=mx.int32)]
        self.rows = [self.rows[i] for i in keep]
