"""Data-parallel rescoring: each rank rescores a share, every rank gets the one report.

    mlx.launch --backend ring -n 2 -- bi-rescore run.jsonl

Invariant kept: the report (counts, first divergences, max |d|, k1/k2/k3, ratios) equals,
field for field and bit for bit, the one a single process computes for the same log and
settings. Floating-point statistics are never reduced across ranks: the ranks exchange the
rescored bit patterns themselves (float32 logprob bits and 64-bit fingerprints, as
unsigned integers, each slot filled by exactly one rank, so the sum is exact whatever the
backend's reduction order), and every rank then compares the whole log in log order with
the single-process code (bi_rl.score.report.compare).

Every rank reads the log (the path must be readable on every host, like the model) and
loads the model; the rescoring order is the single process's, cut into one contiguous
block per rank (bi_rl.dist.split.share_order), each batched at the same batch size.
"""

from __future__ import annotations

import time

import numpy as np

from bi_rl.concat import chosen_sets as concat_sets
from bi_rl.concat import concatenated
from bi_rl.dist.split import share_order
from bi_rl.dist.world import DistError, World
from bi_rl.model import ModelError
from bi_rl.rollout.schema import LogError, canon
from bi_rl.score.rescore import RescoreConfig, RescoreResult, finish, padded_rows, prepare
from bi_rl.score.scorer import Scored, ScoreTrace, score

__all__ = ["ROUND_BATCHES", "rescore"]

USER_ERRORS = (LogError, ModelError, ValueError, NotImplementedError, OSError)
# Forward passes between two rounds. A round carries only "done" and errors; it lets a rank
# notice within the rank timeout that another stopped answering.
ROUND_BATCHES = 8


def rescore(cfg: RescoreConfig, world: World) -> RescoreResult:
    """Rescore `cfg.log` as this rank's part of a data-parallel run; every rank returns the
    same report. Raises DistError (on every rank) when any rank cannot go on."""
    r, error = None, None
    try:
        r = prepare(cfg)
    except USER_ERRORS as e:
        error = str(e)
    world.agree(error, "reading the log and loading the model", setup=True)
    same = canon([len(r.records), r.records[-1].hash, r.order, r.config.batch_size])
    seen = world.gather_bytes(same, "comparing the logs", setup=True)
    if any(s != seen[0] for s in seen):
        bad = ", ".join(str(i) for i, s in enumerate(seen) if s != seen[0])
        raise DistError(
            f"ranks {bad} read a different log or rescoring order than rank 0 (every rank "
            "must see the same log file)",
            shared=True,
        )
    block = share_order(r.order, world.size)[world.rank]
    trace = ScoreTrace()
    t0 = time.perf_counter()
    mine = _score_in_rounds(world, r, block, trace)
    lengths = np.array([len(rec.tokens) for rec in r.records], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    # Rows: logprob bits, fingerprint low and high 32 bits; zero where another rank scores.
    buf = np.zeros((3, int(offsets[-1])), dtype=np.uint32)
    for i, s in zip(block, mine, strict=True):
        a, b = offsets[i], offsets[i + 1]
        fp = np.array(s.fingerprints, dtype=np.uint64)
        buf[0, a:b] = s.logprob_bits
        buf[1, a:b] = (fp & np.uint64(0xFFFFFFFF)).astype(np.uint32)
        buf[2, a:b] = (fp >> np.uint64(32)).astype(np.uint32)
    buf = world.sum_u32(buf.ravel(), "gathering the rescored bits").reshape(buf.shape)
    counts = world.exchange(b"", [len(trace.batches), padded_rows(trace)], "counting batches")
    scored = []
    for i in range(len(r.records)):
        a, b = offsets[i], offsets[i + 1]
        fp = buf[1, a:b].astype(np.uint64) | (buf[2, a:b].astype(np.uint64) << np.uint64(32))
        scored.append(Scored(buf[0, a:b].copy(), fp.tolist()))
    seconds = time.perf_counter() - t0
    return finish(
        r,
        scored,
        batches=sum(c[0] for _, c in counts),
        padded_rows=sum(c[1] for _, c in counts),
        seconds=seconds,
        ranks=world.size,
    )


def _score_in_rounds(world: World, r, block: list[int], trace: ScoreTrace) -> list[Scored]:
    """Score this rank's block, ROUND_BATCHES batches at a time (the same batches one call
    would make), joining a round after each until every rank is done. The sibling
    projections the scorer concatenates are built once for all rounds (each `score` call
    leaves sets it finds built as they are), not once a round."""
    with concatenated(r.model, sets=concat_sets(r.config.mode != "off")):
        return _rounds(world, r, block, trace)


def _rounds(world: World, r, block: list[int], trace: ScoreTrace) -> list[Scored]:
    step = r.config.batch_size * ROUND_BATCHES
    mine: list[Scored] = []
    at = 0
    while True:
        part, error = block[at : at + step], ""
        try:
            if part:
                mine += score(r.model, [r.items[i] for i in part], r.config, trace=trace)
        except USER_ERRORS as e:
            error = str(e) or type(e).__name__
        at += len(part)
        got = world.exchange(error.encode(), [int(at >= len(block))], "rescoring")
        failed = [(k, data.decode()) for k, (data, _) in enumerate(got) if data]
        if failed:
            raise DistError("; ".join(f"rank {k}: {m}" for k, m in failed), shared=True)
        if all(c[0] for _, c in got):
            return mine
