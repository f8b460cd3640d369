"""Continuous-batching rollout engine for mlx-lm models, run inside batch_invariant_mode.

Work is a list of prompts times `n` samples. Unit u = prompt_index * n + sample is one
sequence; its sampling key comes from (seed, prompt id, sample, position) alone
(bi_rl.rollout.sampler), never from the slot it happens to run in.

Scheduling (what may vary from run to run without changing a single bit):
  - up to `batch_size` sequences decode together in one left-padded batch
    (mlx-lm's BatchKVCache: per-sequence RoPE offsets, a mask hiding each row's padding;
    sliding-window layers keep their keys in temporal order: bi_rl.rollout.caches; the
    batch's bookkeeping is bi_rl.rollout.batch);
  - whenever slots are free, waiting units join as a group: their prompts (all but the
    last token; a prompt shared by several samples is prefilled once and fanned out) are
    prefilled right-padded, one chunk of `prefill_chunk` tokens per engine step between
    decode steps, then rolled to left padding and appended to the decode batch; the last
    prompt token is their first decode input;
  - every token is drawn in a decode step: the model's logits row for the sequence goes
    through the shared step (bi_rl.logprobs: float32 logprob at the sampled token, row
    fingerprint of the raw logits) and the keyed sampler, all on the device in the step's
    graph;
  - a sequence finishes on a stop token (kept as its last token), when its decoded
    completion contains a stop string (the token that completed the string is kept, so
    every sampled token and its logprob reach the log; `stop` names the string), or at
    `max_tokens` (finish "length"). Its row stays in the batch, its outputs ignored, until
    new rows need the slot or finished rows are half the batch (a compaction copies every
    cache, while a finished row costs one row of decode work per step).

Pipelining (`EngineConfig.pipeline`, on by default): step t + 1 is queued on the device
(mx.async_eval) before the host reads step t's tokens, so the host builds the next graph,
checks stops and hands out samples while the device computes, and nothing the host does
reads a device value back except those tokens. The price is one step of work for a row that
step t finished, thrown away. With pipeline=False the engine reads each step before queuing
the next, and finished rows leave the batch at once.

Finished samples are released in canonical order (unit order), buffering any that finish
before their predecessors, so the stream of samples, and the log written from it, is the
same whatever the batch size, admission order or schedule.

Invariant kept: a sample's tokens, logprobs and fingerprints depend only on the model, its
prompt, its key and the sampler settings. The model's forward passes run inside
`bi_rl.batch_invariant_mode`, whose kernels make each row's logits independent of the
other rows, the padding and the chunking; everything after the logits is row-local here.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field

import mlx.core as mx
import numpy as np

from bi_rl.concat import chosen_sets as concat_sets
from bi_rl.concat import concatenated
from bi_rl.fusion import grouping, pays_off
from bi_rl.logprobs import (
    fingerprint_ints,
    logprobs_from_bits,
    scaled_logits,
    scaled_token_logprobs,
)
from bi_rl.mode import DEFAULT_MODE, check_mode, held, named_mode
from bi_rl.model.kernels import prepare_kernels
from bi_rl.rollout.batch import Batch, Prefill
from bi_rl.rollout.caches import layer_plan
from bi_rl.rollout.prompts import Prompt
from bi_rl.rollout.sampler import SamplerConfig, draw, row_keys, sequence_id

__all__ = ["DEFAULT_BATCH_SIZE", "Engine", "EngineConfig", "Sample", "Step", "Trace"]

# The default number of sequences processed together, for rollouts and for rescoring.
DEFAULT_BATCH_SIZE = 8
DEFAULT_MAX_TOKENS = 256
DEFAULT_PREFILL_CHUNK = 512


@dataclass(frozen=True)
class EngineConfig:
    """What to generate (n, max_tokens, stops) and how to schedule it (the rest).

    stop_tokens None means the tokenizer's EOS ids. mode: "strict" runs forwards inside
    batch_invariant_mode(strict=True), "fallback" inside strict=False (stock ops where no
    invariant kernel exists, with a warning), "off" runs stock MLX (a negative control).
    pipeline: queue the next decode step before reading the last (module doc).
    """

    n: int = 1
    max_tokens: int = DEFAULT_MAX_TOKENS
    stop_tokens: tuple[int, ...] | None = None
    stop_strings: tuple[str, ...] = ()
    batch_size: int = DEFAULT_BATCH_SIZE
    prefill_chunk: int = DEFAULT_PREFILL_CHUNK
    mode: str = DEFAULT_MODE
    pipeline: bool = True

    def __post_init__(self):
        for name in ("n", "max_tokens", "batch_size", "prefill_chunk"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if any(not s for s in self.stop_strings):  # "" is in every text: all would stop at once
            raise ValueError("a stop string must not be empty")
        check_mode(self.mode)


@dataclass
class Sample:
    """One finished sample: everything the log records about it (before hashing)."""

    prompt_index: int
    prompt_id: str
    sample: int
    prompt_tokens: tuple[int, ...]
    tokens: list[int] = field(default_factory=list)
    logprob_bits: list[int] = field(default_factory=list)
    fingerprints: list[int] = field(default_factory=list)
    finish: str | None = None
    stop: int | str | None = None

    @property
    def unit(self) -> tuple[int, int]:
        return (self.prompt_index, self.sample)

    @property
    def logprobs(self) -> np.ndarray:
        return logprobs_from_bits(self.logprob_bits)


@dataclass
class Step:
    """What one engine step did: samples released (canonical order) and tokens processed."""

    ready: list[Sample]
    generated: int
    prefilled: int
    active: int


@dataclass
class Trace:
    """The schedule actually run, for tests that must prove a schedule differed."""

    rows: list[tuple[int, ...]] = field(default_factory=list)  # units per decode step
    left_padding: list[tuple[int, ...]] = field(default_factory=list)  # per decode step
    admissions: list[tuple[int, tuple[int, ...], int]] = field(default_factory=list)
    # (decode step index, units admitted, rows already decoding)


@dataclass
class _Seq:
    unit: int
    seq_id: int
    out: Sample
    position: int = 0  # the completion position of the next token launched for it
    done: bool = False


@dataclass
class _Launched:
    """A decode step queued on the device: its rows (as they were in the batch) and outputs."""

    rows: list[_Seq]
    tokens: mx.array
    logprobs: mx.array
    fingerprints: mx.array
    vocab: int


_LITTLE = sys.byteorder == "little"


def _read_bits(lps: mx.array, fps: mx.array) -> tuple[list[int], list[int]]:
    """(logprob bits, fingerprint ints) of a step as Python ints, read through the arrays'
    buffers: float32 bits as native uint32, and each row's two uint32 lanes (lane 0 first)
    as one little-endian uint64, which is fingerprint_ints' (lane 1 << 32) | lane 0."""
    try:
        if _LITTLE:
            return (
                memoryview(lps).cast("B").cast("I").tolist(),
                memoryview(fps).cast("B").cast("Q").tolist(),
            )
    except TypeError:  # a strided result: memoryview casts need C-contiguous buffers
        pass
    return np.array(lps).view(np.uint32).tolist(), fingerprint_ints(np.array(fps))


class Engine:
    """Generates samples for prompts with a loaded mlx-lm (model, tokenizer); the sampler's
    settings and seed decide every token."""

    def __init__(self, model, tokenizer, sampler: SamplerConfig, config: EngineConfig):
        self.layer_plan = layer_plan(model, "the rollout engine (batched decoding)")
        self.model = model
        self.tokenizer = tokenizer
        self.sampler = sampler
        self.config = config
        stops = config.stop_tokens
        if stops is None:
            stops = tuple(sorted(getattr(tokenizer, "eos_token_ids", ()) or ()))
        self.stop_tokens = frozenset(stops)
        if config.mode != "off":  # a first run on a Hopper GPU compiles (and says so) here
            prepare_kernels(model, config.batch_size * config.prefill_chunk)
        self.pipelined = config.pipeline

    # -- the public loop ------------------------------------------------------------------

    def generate(
        self,
        prompts: Sequence[Prompt],
        *,
        start: int = 0,
        units: Sequence[int] | None = None,
        order: Sequence[int] | None = None,
        trace: Trace | None = None,
    ) -> Iterator[Step]:
        """Run every unit from `start` on (units before it were done by an earlier run).

        units: run exactly these units instead (distinct, each in range(total)), released
        in ascending order; a data-parallel rank runs its share of a run this way.
        order: the admission order of the units to run (a permutation of them); default
        is canonical order. It changes the schedule, never the samples.
        """
        n = self.config.n
        total = len(prompts) * n
        todo = list(range(start, total)) if units is None else sorted(units)
        in_range = not todo or (todo[0] >= 0 and todo[-1] < total)
        if units is not None and (len(set(todo)) != len(todo) or not in_range):
            raise ValueError(f"units must be distinct unit numbers in [0, {total})")
        waiting = list(todo) if order is None else list(order)
        if sorted(waiting) != todo:
            raise ValueError("order must be a permutation of the units to run")
        waiting.reverse()  # pop() from the end
        # The mode is entered once a step (prefill chunk, decode launch); holding its
        # wrappers installed for the run makes each entry a push on the thread's stack.
        # Where the backend computes sibling projections (q/k/v, gate/up) in one launch, the
        # run groups them (bi_rl.fusion): the same bits, fewer launches a decode step. Sets
        # that bi_rl.concat.chosen_sets names (on Hopper, inside the mode and, outside it,
        # where a decode step holds more than one row, unless BI_RL_CONCAT_PROJECTIONS says
        # otherwise) are one product over concatenated weights instead, the same bits in the
        # mode.
        invariant = self.config.mode != "off"
        rows = min(self.config.batch_size, len(todo))
        with (
            held() if invariant else nullcontext(),
            concatenated(self.model, sets=concat_sets(invariant, rows)),
            grouping(self.model, invariant and pays_off()),
        ):
            yield from self._loop(prompts, n, todo, waiting, trace)

    def _loop(self, prompts, n, todo, waiting, trace) -> Iterator[Step]:
        """The scheduling loop of `generate` (module doc)."""
        batch = Batch()
        filling: Prefill | None = None
        inflight: _Launched | None = None
        finished: dict[int, Sample] = {}
        released = 0  # todo[:released] have been yielded
        steps = 0
        while waiting or filling or batch.rows:
            prefilled = 0
            free = self.config.batch_size - batch.live
            if filling is None and waiting and free > 0:
                group = [waiting.pop() for _ in range(min(free, len(waiting)))]
                seqs = [self._new_seq(u, prompts) for u in group]
                keyed = [(u // n, prompts[u // n].tokens) for u in group]
                filling = Prefill.open(seqs, keyed, self.layer_plan, self.config.prefill_chunk)
            if filling is not None:
                if not filling.done:
                    prefilled = filling.advance(self.model, self.config.mode)
                if filling.done:
                    if len(batch.rows) + len(filling.rows) > self.config.batch_size:
                        batch.compact()
                    if trace is not None:
                        admitted = tuple(s.unit for s in filling.rows)
                        trace.admissions.append((steps, admitted, batch.live))
                    batch.join(filling)
                    filling = None
            launched = None
            if batch.rows and batch.live:
                if trace is not None:
                    trace.rows.append(tuple(s.unit for s in batch.rows))
                    trace.left_padding.append(tuple(batch.pad))
                launched = self._launch(batch)
                steps += 1
            done, inflight = (inflight, launched) if self.pipelined else (launched, None)
            generated = self._collect(done, finished) if done is not None else 0
            # Finished rows stay until new rows need their slots or they are half the batch
            # (module doc); one step at a time, they leave at once.
            if batch.dead and (not self.pipelined or 2 * batch.dead >= len(batch.rows)):
                batch.compact()
            ready = []
            while released < len(todo) and todo[released] in finished:
                ready.append(finished.pop(todo[released]))
                released += 1
            yield Step(ready, generated=generated, prefilled=prefilled, active=batch.live)

    # -- pieces -------------------------------------------------------------------------

    def _new_seq(self, unit: int, prompts: Sequence[Prompt]) -> _Seq:
        p_index, k = divmod(unit, self.config.n)
        p = prompts[p_index]
        if not p.tokens:
            raise ValueError(f"prompt {p.id!r} has no tokens")
        out = Sample(prompt_index=p_index, prompt_id=p.id, sample=k, prompt_tokens=p.tokens)
        return _Seq(unit=unit, seq_id=sequence_id(p.id, k), out=out)

    def _launch(self, batch: Batch) -> _Launched:
        """Queue one decode step for every row of the batch; its outputs stay on the device
        until `_collect` reads them, and its tokens are the batch's next inputs."""
        rows = list(batch.rows)
        keys = row_keys(self.sampler.seed, [(s.seq_id, s.position) for s in rows])
        for s in rows:
            s.position += 1
        with named_mode(self.config.mode):
            logits = self.model(batch.y[:, None], cache=batch.caches)[:, -1, :]
            x = scaled_logits(logits, self.sampler.temperature)  # shared: the same bits
            tokens, fps = draw(logits, x, keys, self.sampler)
            lps = scaled_token_logprobs(x, tokens)
        mx.async_eval(tokens, lps, fps)
        batch.y = tokens
        return _Launched(rows, tokens, lps, fps, logits.shape[-1])

    def _collect(self, step: _Launched, finished: dict[int, Sample]) -> int:
        """Wait for a launched step, append its tokens to the rows still going, move the
        rows it finished to `finished`; returns how many tokens it added."""
        tok = step.tokens.tolist()
        lp_bits, fp = _read_bits(step.logprobs, step.fingerprints)
        added = 0
        for s, t, b, f in zip(step.rows, tok, lp_bits, fp, strict=True):
            if s.done:
                continue  # finished at an earlier step: this row's output is not its own
            if t >= step.vocab:
                raise FloatingPointError("the model produced a logits row with no maximum (NaN)")
            s.out.tokens.append(t)
            s.out.logprob_bits.append(b)
            s.out.fingerprints.append(f)
            added += 1
            if self._finished(s.out):
                s.done = True
                finished[s.unit] = s.out
        return added

    def _finished(self, out: Sample) -> bool:
        last = out.tokens[-1]
        if last in self.stop_tokens:
            out.finish, out.stop = "stop", last
            return True
        if self.config.stop_strings:
            text = self.tokenizer.decode(out.tokens)
            for s in self.config.stop_strings:
                if s in text:
                    out.finish, out.stop = "stop", s
                    return True
        if len(out.tokens) >= self.config.max_tokens:
            out.finish = "length"
            return True
        return False
