"""Scorer: float32 logprobs and logit-row fingerprints of logged tokens, by full forward passes.

Given samples as (prompt tokens, completion tokens), the scorer runs the model over each
whole sequence `prompt + completion[:-1]` (the last completion token is a target, never an
input) and reads, at every completion position, the logits row that predicted that token.
Those rows go through exactly the functions the rollout engine used at sampling time
(bi_rl.logprobs): `token_logprobs` for the float32 logprob at the given temperature and
`row_fingerprints` for the exact digest of the raw logits (on CUDA computed in one pass,
bi_rl.rollout.sampler.fingerprints, the same integers). Optionally the keyed sampler
(bi_rl.rollout.sampler.sample) re-derives each token from its key and the same rows.

Batch composition is free, so it can be made to differ from the rollout's on purpose:
  - samples are scored in `order` (any permutation), `batch_size` at a time;
  - each batch is right padded to its longest sequence (padding sits after a row's real
    tokens, so under a causal mask no real position ever attends to it);
  - with `chunk`, a batch is fed `chunk` positions at a time through mlx-lm's KV cache
    (the decode-like path); without, in one forward pass (through fresh caches for a model
    with sliding-window layers, so the window comes from the cache as in decode:
    bi_rl.rollout.caches).
Forward passes and the logits -> logprob step run inside `batch_invariant_mode` (mode
"strict" or "fallback"), or on stock MLX (mode "off", a negative control).

Invariant kept: sample i's logprobs, fingerprints and re-derived tokens depend only on the
model, sample i's tokens (and key) and the temperature: the mode's kernels make each row's
logits independent of the batch, the padding and the chunking, and everything after the
logits is row-local. `ScoreTrace` records the composition actually run, so tests can prove
it differed from the rollout's.

Host and device overlap twice, neither changing a bit: batch i + 1's graph is built while the
device runs batch i (its results read afterwards), and within a pass each decoder layer is
queued on the device as soon as it is built (bi_rl.score.queued), so the device starts on
the first layers while the host builds the rest.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import mlx.core as mx
import numpy as np

from bi_rl.concat import chosen_sets as concat_sets
from bi_rl.concat import concatenated
from bi_rl.logprobs import (
    check_temperature,
    fingerprint_ints,
    logprob_temperature,
    logprobs_from_bits,
    scaled_logits,
    scaled_token_logprobs,
)
from bi_rl.mode import DEFAULT_MODE, check_mode, named_mode
from bi_rl.rollout.engine import DEFAULT_BATCH_SIZE
from bi_rl.rollout.sampler import SamplerConfig, fingerprints, row_keys, sample_scaled
from bi_rl.score.queued import queued_layers

__all__ = ["Item", "ScoreConfig", "ScoreTrace", "Scored", "score", "shuffled_order"]
PAD_ID = 0  # what fills the right padding; never read (causal mask, positions after the row)


@dataclass(frozen=True)
class Item:
    """One sample to score; `seq_id` (bi_rl.rollout.sampler.sequence_id) keys re-derivation."""

    prompt: tuple[int, ...]
    completion: tuple[int, ...]
    seq_id: int | None = None


@dataclass(frozen=True)
class ScoreConfig:
    """How to batch (batch_size, chunk) and what to compute (temperature, mode).

    chunk None scores each batch in one forward pass; an int feeds `chunk` positions at a
    time through a KV cache. temperature is the sampler's (0 = greedy, logprobs at T = 1).
    """

    batch_size: int = DEFAULT_BATCH_SIZE
    chunk: int | None = None
    temperature: float = 1.0
    mode: str = DEFAULT_MODE

    def __post_init__(self):
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")
        if self.chunk is not None and self.chunk < 1:
            raise ValueError(f"chunk must be >= 1 (or None for whole sequences), got {self.chunk}")
        check_mode(self.mode)
        check_temperature(self.temperature)


@dataclass
class Scored:
    """One sample's results, per completion token."""

    logprob_bits: np.ndarray  # uint32 bit patterns of the float32 logprobs
    fingerprints: list[int]  # 64-bit logit-row fingerprints
    tokens: list[int] | None = None  # re-derived tokens (with derive)

    @property
    def logprobs(self) -> np.ndarray:
        return logprobs_from_bits(self.logprob_bits)


@dataclass
class ScoreTrace:
    """The composition actually run: item indices, right padding and chunk starts per batch."""

    batches: list[tuple[int, ...]] = field(default_factory=list)
    padding: list[tuple[int, ...]] = field(default_factory=list)
    chunk_starts: list[tuple[int, ...]] = field(default_factory=list)
    # per forward pass that reads logits: the rows the output head ran on, and the positions
    # the pass covered (batch x chunk); fewer rows than positions where the head ran on the
    # rows that predict completion tokens alone (ROW_HEAD_FAMILIES)
    head_rows: list[tuple[int, int]] = field(default_factory=list)


def shuffled_order(n: int, seed: int) -> list[int]:
    """A permutation of range(n) that is a pure function of (n, seed)."""
    return [int(i) for i in np.random.default_rng(seed).permutation(n)]


def _check_items(items: Sequence[Item]) -> None:
    for i, it in enumerate(items):
        if not it.prompt:
            raise ValueError(f"sample {i} has an empty prompt: nothing predicts its first token")


def score(
    model,
    items: Sequence[Item],
    config: ScoreConfig = ScoreConfig(),
    *,
    order: Sequence[int] | None = None,
    derive: SamplerConfig | None = None,
    trace: ScoreTrace | None = None,
    progress: Callable[[int, int, int], None] | None = None,
    queue_layers: bool = True,
) -> list[Scored]:
    """Score every item; results come back in item order whatever `order` was.

    order: the order samples are batched in (a permutation of range(len(items)));
    default is item order. derive: also re-derive each token with this sampler (its
    settings and seed; items need seq_id). progress(items done, items, tokens scored by
    the batch) is called after each batch. queue_layers: queue each decoder layer on the
    device as it is built (bi_rl.score.queued); False evaluates each pass as a whole, with
    the same bits (for timing the difference).
    """
    from bi_rl.rollout.caches import layer_plan  # imports mlx_lm, which is slow

    _check_items(items)
    try:
        plan = layer_plan(model, "chunked scoring (score whole sequences instead)")
    except NotImplementedError:
        if config.chunk is not None:
            raise
        plan = None  # whole sequences need no cache
    order = list(range(len(items))) if order is None else [int(i) for i in order]
    if sorted(order) != list(range(len(items))):
        raise ValueError("order must be a permutation of the items")
    if derive is not None and any(it.seq_id is None for it in items):
        raise ValueError("re-deriving tokens needs every item's seq_id")
    out: list[Scored | None] = [None] * len(items)
    bs = config.batch_size
    # Batches are pipelined: batch i + 1's graph is built while the device runs batch i, and
    # its first evaluation waits until batch i's outputs are ready (`settle`), so at most one
    # batch holds the device's memory at a time (SCORE_ELEMENTS still bounds a batch's
    # logits). Batch i's results are read on the host after batch i + 1 is queued. What each
    # batch computes, and so every bit, is the same as one batch after another.
    pending: tuple[int, list[int], _Pending] | None = None  # (items done with it, its items, it)

    def settle() -> None:
        if pending is not None:
            pending[2].wait()

    def finish() -> None:
        nonlocal pending
        if pending is None:
            return
        done, group, job = pending
        pending = None
        for i, res in zip(group, job.results(), strict=True):
            out[i] = res
        if progress is not None:
            progress(done, len(order), sum(len(items[i].completion) for i in group))

    # The sets of sibling projections bi_rl.concat.chosen_sets names, each one product over
    # concatenated weights (the same bits in the mode)
    with (
        concatenated(model, sets=concat_sets(config.mode != "off")),
        queued_layers(model, queue_layers) as queue,
    ):
        for b in range(0, len(order), bs):
            group = order[b : b + bs]
            batch = [items[i] for i in group]
            job = _score_batch(model, plan, batch, config, derive, trace, group, settle, queue)
            finish()
            pending = (b + len(group), group, job)
        finish()
    return out  # type: ignore[return-value]


class _Pending:
    """A batch's results, some read already (`parts`: per row, (logprob bits, fingerprints,
    tokens) of each chunk), the last chunk's still on the device (`outs`, queued by
    mx.async_eval, with its per-row `counts`); `derived`: tokens were re-derived."""

    def __init__(self, parts: list[list[tuple]], outs, counts, derived: bool):
        self.parts, self.outs, self.counts, self.derived = parts, outs, counts, derived

    def wait(self) -> None:
        """Block until the queued outputs are computed (reading none of them)."""
        if self.outs is not None:
            mx.eval(self.outs)

    def results(self) -> list[Scored]:
        if self.outs is not None:
            _read_chunk(self.parts, self.outs, self.counts)
            self.outs = None
        results = []
        for p in self.parts:
            bits = np.concatenate([q[0] for q in p]) if p else np.zeros(0, np.uint32)
            fps = [f for q in p for f in q[1]]
            toks = [t for q in p for t in q[2]] if self.derived else None
            results.append(Scored(bits.astype(np.uint32), fps, toks))
        return results


def _read_chunk(parts: list[list[tuple]], outs: list, counts: list[int]) -> None:
    """Append one chunk's evaluated outputs to each row's parts (rows with no completion
    token in the chunk get nothing)."""
    lp_bits = np.array(outs[0]).view(np.uint32)
    fp = fingerprint_ints(np.array(outs[1]))
    tok = np.array(outs[2]).tolist() if len(outs) > 2 else None
    at = 0
    for r, n in enumerate(counts):
        if n:
            part_tokens = tok[at : at + n] if tok is not None else None
            parts[r].append((lp_bits[at : at + n], fp[at : at + n], part_tokens))
            at += n


def _score_batch(
    model, plan, items: list[Item], cfg: ScoreConfig, derive, trace, group, settle, queue
) -> _Pending:
    """Build and queue one batch: every chunk but the last evaluated and read here, the last
    one's outputs queued (mx.async_eval) for `_Pending.results`. `settle()` runs once, before
    the batch's first evaluation (the caller waits there for the batch before it), which is
    the first decoder layer queued where `queue` (a bi_rl.score.queued.LayerQueue) is given."""
    seqs = [list(it.prompt) + list(it.completion[:-1]) for it in items]
    longest = max(len(s) for s in seqs)
    tokens = mx.array([s + [PAD_ID] * (longest - len(s)) for s in seqs], dtype=mx.int32)
    # Completion token j of row r is predicted at position len(prompt) - 1 + j.
    starts = [len(it.prompt) - 1 for it in items]
    step = longest if cfg.chunk is None else cfg.chunk
    chunk_starts = tuple(range(0, longest, step))
    if trace is not None:
        trace.batches.append(tuple(group))
        trace.padding.append(tuple(longest - len(s) for s in seqs))
        trace.chunk_starts.append(chunk_starts)
    cache = None
    if plan is not None and (plan.has_windows or len(chunk_starts) > 1):
        from bi_rl.rollout.caches import scoring_caches

        cache = scoring_caches(plan)
    parts: list[list[tuple]] = [[] for _ in items]  # per row: (bits, fps, tokens) per chunk
    settled = False

    def before_eval() -> None:  # settle(), once
        nonlocal settled
        if not settled:
            settle()
            settled = True

    if queue is not None:
        queue.arm(before_eval)
    checked = False
    for s in chunk_starts:
        e = min(s + step, longest)
        last = s == chunk_starts[-1]
        rows, targets, keys, counts = _chunk_rows(items, starts, s, e, derive is not None)
        with named_mode(cfg.mode):
            if not rows:  # a prompt-only chunk: just grow the cache (its logits stay unbuilt)
                logits = model(tokens[:, s:e], cache=cache)
                before_eval()
                mx.eval([c.state for c in cache] if cache is not None else logits)
                continue
            most = min(HEAD_ELEMENTS, SCORE_ELEMENTS)
            pieces, head = head_pieces(
                model, tokens[:, s:e], cache, mx.array(rows, dtype=mx.int32), most
            )
            vocab = pieces[0].shape[-1]
            if not checked:
                _check_vocab(items, group, vocab)
                checked = True
            if trace is not None:
                trace.head_rows.append((head, len(items) * (e - s)))
            if len(pieces) > 1:  # _row_outputs evaluates piece by piece
                before_eval()
            outs = _row_outputs(pieces, targets, keys, cfg, derive)
            states = [c.state for c in cache] if cache is not None else []
            before_eval()
            if last:
                mx.async_eval(*outs, states)
                return _Pending(parts, outs, counts, derive is not None)
            mx.eval(*outs, states)
        _read_chunk(parts, outs, counts)
    before_eval()
    return _Pending(parts, None, None, derive is not None)


# Model families (mlx-lm model_type) whose Model.__call__ is `self.model(...)`, the body
# (embeddings, layers, final norm), followed by an output head that acts on each position's
# hidden state alone: lm_head or the tied embedding, and gemma2's logit soft cap. For these
# the scorer runs the head on the rows it reads (the positions that predict completion
# tokens) and on no other: prompt and padding positions cost no vocabulary-wide GEMM and no
# logits memory. Other families compute every position's logits and the rows are taken from
# them. Either way a row's bits are the same where the head's GEMM is batch-invariant (the
# mode's kernels give each row the bits it has in any other set of rows).
ROW_HEAD_FAMILIES = frozenset(
    {"llama", "mistral", "ministral3", "qwen2", "qwen3", "qwen3_moe", "phi3", "mixtral",
     "gpt_oss", "gemma2", "gemma3_text"}
)  # fmt: skip


def _row_head(model) -> bool:
    kind = getattr(getattr(model, "args", None), "model_type", None)
    # (an nn.Module is a dict of its children; anything else is called as it is)
    return (
        kind in ROW_HEAD_FAMILIES
        and isinstance(model, dict)
        and isinstance(model.get("model"), dict)
    )


class _BodyRows:
    """Stands in for a model's body (`model.model`) during the calls of one forward pass: the
    body runs on the first call, and each call returns its output at the flat rows
    `rows[piece]` (row-major over batch x positions) alone, as one batch row
    (1, rows, hidden); every attribute the head reads (embed_tokens) is the body's."""

    def __init__(self, body, rows: mx.array):
        self._body, self._rows, self._hidden = body, rows, None
        self.piece = slice(None)

    def __call__(self, *args, **kwargs):
        if self._hidden is None:
            h = self._body(*args, **kwargs)
            self._hidden = h.reshape(-1, h.shape[-1])[self._rows]
        return self._hidden[self.piece][None]

    def __getattr__(self, name):
        return getattr(self._body, name)


# The most elements one call of the output head may produce. Stock MLX's CUDA quantized
# matmul indexes its output with 32-bit integers and fails to launch (or writes out of
# bounds) from 2**31 elements on, e.g. rescoring 64 samples of 256 tokens against a
# 151936-token vocabulary. Past this the head runs on pieces of rows; the mode's kernels give
# each row the same bits in any piece, and the pieces also bound the logits' memory.
HEAD_ELEMENTS = 2**31 - 1
# The most logits one piece of a scoring pass holds. Each piece is evaluated before the next is
# built (`_row_outputs`), so a pass holds one piece's logits and the float32 temporaries of its
# logprobs and fingerprints (together about twenty bytes a logit) rather than every piece's:
# 2**28 logits is about 5 GiB at once, where 64 samples of 256 tokens against a 151936-token
# vocabulary all at once would need about 50.
SCORE_ELEMENTS = 2**28


def head_pieces(
    model, inputs: mx.array, cache, rows: mx.array, most: int | None = None
) -> tuple[list[mx.array], int]:
    """The rows `rows` of model(inputs, cache=cache) flattened over (batch, positions), as
    consecutive pieces of (piece rows, vocab) with at most `most` elements each, and how many
    rows the head ran on. Where the family allows it (ROW_HEAD_FAMILIES) the body runs once
    and the head once per piece on those rows alone; else every position's logits are
    computed and the rows taken from them, the model run on groups of batch rows whose
    logits keep within `most` where that is possible (no cache, since a cache holds the
    whole batch; and one batch row's logits within `most`). `most` defaults to
    HEAD_ELEMENTS."""
    most = HEAD_ELEMENTS if most is None else most
    if not _row_head(model):
        logits = model(inputs, cache=cache)  # lazy: only its shape is read if it is split
        b, t = inputs.shape[:2]
        per = most // (t * logits.shape[-1])  # batch rows a call may take
        split = logits.size > most and cache is None and per >= 1
        at = np.array(rows) if split else None  # flat indices: row r's in [r t, (r + 1) t)
        if not split or (np.diff(at) <= 0).any():
            flat = logits.reshape(-1, logits.shape[-1])[rows]
            return _split(flat, most, lambda p: flat[p]), inputs.size
        pieces = []
        for lo in range(0, b, per):
            hi = min(lo + per, b)
            sel = at[(at >= lo * t) & (at < hi * t)] - lo * t
            if sel.size:
                part = model(inputs[lo:hi])
                pieces.append(part.reshape(-1, part.shape[-1])[mx.array(sel)])
        return pieces, inputs.size
    # An instance attribute is found before the module's child of the same name (nn.Module
    # looks children up only when ordinary lookup fails); removing it restores the child.
    body = _BodyRows(model["model"], rows)
    vars(model)["model"] = body

    def head(piece: slice) -> mx.array:
        body.piece = piece
        out = model(inputs, cache=cache)
        if out.shape[:2] != (1, len(range(*piece.indices(rows.size)))):
            raise RuntimeError(
                f"{type(model).__module__}: the output head changed the shape of the rows it "
                f"was given ({out.shape}); remove its model_type from ROW_HEAD_FAMILIES"
            )
        return out[0]

    try:
        whole = head(slice(None))  # lazy: only its shape is read unless it is the one piece
        return _split(whole, most, head), rows.size
    finally:
        vars(model).pop("model", None)


def _split(whole: mx.array, most: int, piece) -> list[mx.array]:
    """[whole] if it has at most `most` elements, else piece(rows slice) for consecutive
    slices of as many rows as keep each within `most`."""
    n, width = whole.shape
    if n * width <= most:
        return [whole]
    step = max(1, most // width)
    return [piece(slice(lo, min(lo + step, n))) for lo in range(0, n, step)]


def piece_spans(pieces: list[mx.array]):
    """(piece, the slice of all pieces' rows it holds) for each of `head_pieces`' pieces."""
    at = 0
    for piece in pieces:
        yield piece, slice(at, at + piece.shape[0])
        at += piece.shape[0]


def _row_outputs(pieces: list[mx.array], targets, keys, cfg: ScoreConfig, derive) -> list:
    """[logprobs, fingerprints(, re-derived tokens)] of the logits rows in `pieces`, each
    computed piece by piece (every one is row-local) and joined in row order. With several
    pieces, each piece's outputs are evaluated and its entry in `pieces` dropped before the
    next is built, so its logits and temporaries are freed (SCORE_ELEMENTS)."""
    outs: list[list[mx.array]] = []
    several = len(pieces) > 1
    for i, (flat, span) in enumerate(piece_spans(pieces)):
        x = scaled_logits(flat, cfg.temperature)
        part = [
            scaled_token_logprobs(x, mx.array(targets[span], dtype=mx.int32)),
            fingerprints(flat),  # row_fingerprints' integers (one pass on CUDA)
        ]
        if derive is not None:
            # the sampler sees the same scaled logits where it samples at the same
            # temperature (one cast and divide of the rows, not two)
            same = logprob_temperature(derive.temperature) == logprob_temperature(cfg.temperature)
            xd = x if same else scaled_logits(flat, derive.temperature)
            part.append(sample_scaled(xd, row_keys(derive.seed, keys[span]), derive))
        if several:
            mx.eval(part)
            pieces[i] = None  # (flat and x are rebound before the next piece is evaluated)
        outs.append(part)
    if len(outs) == 1:
        return outs[0]
    return [mx.concatenate(col, axis=0) for col in zip(*outs, strict=True)]


def _chunk_rows(items: list[Item], starts: list[int], s: int, e: int, keyed: bool):
    """For positions [s, e): flat indices of the logits rows that predict completion tokens
    (row-major over (batch, chunk)), their targets, (seq_id, position) keys and per-row counts."""
    rows, targets, keys, counts = [], [], [], []
    for r, it in enumerate(items):
        lo, hi = max(s, starts[r]), min(e, starts[r] + len(it.completion))
        counts.append(max(0, hi - lo))
        for p in range(lo, hi):
            j = p - starts[r]
            rows.append(r * (e - s) + (p - s))
            targets.append(it.completion[j])
            if keyed:
                keys.append((it.seq_id, j))
    return rows, targets, keys, counts


def _check_vocab(items: list[Item], group: Sequence[int], vocab: int) -> None:
    for r, it in enumerate(items):
        top = max((*it.prompt, *it.completion))
        if top >= vocab or min((*it.prompt, *it.completion)) < 0:
            raise ValueError(
                f"sample {group[r]}: token id {top} is outside the model's vocabulary ({vocab} ids)"
            )
