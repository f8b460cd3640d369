"""Data-parallel rollouts: the ranks share the samples, rank 0 writes the one log.

    mlx.launch --backend ring -n 2 -- bi-rollout --n 4 --out run.jsonl     # 2 CPU processes
    mlx.launch --backend nccl -n 2 -- bi-rollout --model DIR --prompts FILE   # 2 GPUs

Invariant kept: the log is byte-identical to the one a single process writes for the same
settings, whatever the number of ranks, the split or the timing, and a killed run resumed
with any number of ranks ends in the same bytes. Two facts make that so: a sample's
tokens, logprobs and fingerprints depend only on the model, its prompt, its key and the
sampler settings (batch-invariant kernels, keyed sampler), so any rank can make any
sample; and rank 0 alone writes the log, appending samples in canonical order through the
same `LogWriter` a single process uses, so the records and their hash chain are the same.

A run, on every rank:
  1. plan it (load the model and prompts, build the header; no output touched) and agree
     that every rank could, and that every rank's header is the same run;
  2. rank 0 opens the log (new, resumed or replacing another, exactly as one process does:
     bi_rl.rollout.run) and its spool (bi_rl.dist.spool), and tells every rank which
     samples are done; the rest is split by
     `bi_rl.dist.split.share_units`, a pure function of that list and the number of ranks;
  3. each rank generates its share; every EXCHANGE_STEPS engine steps (and once its share
     is done) it sends its newly finished samples to rank 0 in a round all ranks join;
     rank 0 appends every sample that continues the log and spools the others. Rounds go
     on until every rank is done;
  4. rank 0 closes the log, deletes the spool and appends the run to the sidecar.

Failure: a rank's error (bad input, a refused op) is sent in the next round, and every
rank stops with it; a lost rank fails its peers' next collective (bi_rl.dist.world). Either
way rank 0 records the run in the sidecar as incomplete (`RunSummary.incomplete`) with
the number of records the log holds, and the message says how to continue: `--resume`,
with any number of ranks. The log itself then has fewer records than its header promises,
which bi-audit reports.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace

import numpy as np
import orjson

from bi_rl.dist.split import share_units
from bi_rl.dist.spool import Spool, decode, encode
from bi_rl.dist.world import DistError, Terminated, World, stopping
from bi_rl.model import ModelError
from bi_rl.rollout.engine import Sample, Step
from bi_rl.rollout.log import LogWriter
from bi_rl.rollout.prompts import PromptError
from bi_rl.rollout.run import (
    Plan,
    RolloutConfig,
    RolloutError,
    RolloutInterrupted,
    check_out,
    open_log,
    plan,
    run_summary,
    write_samples,
)
from bi_rl.rollout.schema import LogError, RunSummary, Sidecar, canon, differing_fields

__all__ = ["EXCHANGE_STEPS", "rollout"]

# Engine steps between two rounds. A round makes every rank wait for the slowest, so it
# should not come every step; rank 0 holds (and spools) what arrives early.
EXCHANGE_STEPS = 8
# What a user can cause while a run is planned or opened: reported, never a traceback.
USER_ERRORS = (
    ModelError,
    RolloutError,
    PromptError,
    LogError,
    ValueError,
    NotImplementedError,
    OSError,
)


def rollout(
    cfg: RolloutConfig,
    world: World,
    progress: Callable[[Step, int, int], None] | None = None,
) -> RunSummary | None:
    """Run `cfg` as this rank's part of a data-parallel run (a world of one works too).

    Returns the run summary on rank 0 (also appended to the sidecar), None elsewhere.
    Raises DistError when any rank cannot go on; the log is then resumable.
    """
    p, checked, error = None, None, None
    try:
        if world.rank == 0:  # the output first: it is only read here
            checked = check_out(cfg)
        p = plan(cfg)
    except USER_ERRORS as e:
        error = str(e)
    world.agree(error, "checking the inputs", setup=True)
    _check_same_run(world, p)
    merger, error = None, None
    if world.rank == 0:
        try:
            merger = _Merger.open(cfg, p, *checked, world.size)
        except USER_ERRORS as e:
            error = str(e)
    world.agree(error, "opening the log", setup=True)
    try:
        if merger is not None:
            world.on_timeout.append(merger.stop_note)
        done = _done_units(world, merger, p.total)
        left = [u for u in range(p.total) if not done[u]]
        mine = share_units(left, p.engine.config.n, world.size)[world.rank]
        _generate(world, p, mine, merger, progress)
        return merger.finish() if merger is not None else None
    except BaseException as e:
        try:
            stopping()
        except Terminated:  # the launcher's SIGTERM, landing while e is handled: e says more
            pass
        if merger is None:
            raise
        note = merger.stopped(f"{type(e).__name__}: {e}" if str(e) else type(e).__name__)
        if isinstance(e, DistError):
            raise DistError(f"{e}{note}", e.shared, e.lost) from None
        if isinstance(e, Terminated):
            raise DistError(f"rank 0: {e}{note}", lost=True) from None
        if isinstance(e, KeyboardInterrupt):
            raise RolloutInterrupted(cfg.out, merger.writer.in_place) from None
        raise


def _check_same_run(world: World, p: Plan) -> None:
    """Refuse, on every rank, a run whose ranks disagree on the header (settings, model,
    prompts, versions, backend or device): the log's header speaks for every record."""
    h = p.header.to_json()
    mine = canon({"run": h["run"], "env": {k: v for k, v in h["env"].items() if k != "model_path"}})
    said = world.gather_bytes(mine, "comparing the run settings", setup=True)
    every = [orjson.loads(b) for b in said]
    bad = []
    for r, other in enumerate(every[1:], start=1):
        diff = differing_fields(every[0], other)
        if diff:
            bad.append(f"rank {r} differs from rank 0 in {', '.join(diff)}")
    if bad:
        raise DistError(
            "; ".join(bad) + " (every rank must run the same model, prompts, settings and "
            "versions on the same kind of device)",
            shared=True,
        )


def _done_units(world: World, merger: _Merger | None, total: int) -> np.ndarray:
    """A bool per unit, from rank 0: is the sample already in the log or the spool?"""
    bits = b""
    if merger is not None:
        bits = np.packbits(merger.done_mask(total)).tobytes()
    got = world.gather_bytes(bits, "sharing the samples already done", setup=True)[0]
    return np.unpackbits(np.frombuffer(got, dtype=np.uint8), count=total).astype(bool)


def _generate(world: World, p: Plan, mine: list[int], merger, progress) -> None:
    """Generate this rank's share, joining rounds until every rank is done."""
    n = p.engine.config.n
    steps = iter(p.engine.generate(p.prompts, units=mine)) if mine else iter(())
    released = 0
    while True:
        ready: list[Sample] = []
        generated = prefilled = 0
        error = ""
        try:
            for _ in range(EXCHANGE_STEPS):
                if released == len(mine):
                    break
                step = next(steps)
                ready += step.ready
                released += len(step.ready)
                generated += step.generated
                prefilled += step.prefilled
        except USER_ERRORS as e:  # reported to every rank in this round
            error = str(e) or type(e).__name__
        except Exception as e:
            error = f"{type(e).__name__}: {e}"
        finished = released == len(mine)
        payload = error.encode() if error else (encode(ready, n) if world.rank else b"")
        got = world.exchange(
            payload,
            [int(finished or bool(error)), generated, prefilled, int(bool(error))],
            "sending samples to rank 0",
        )
        failed = [(r, data.decode()) for r, (data, c) in enumerate(got) if c[3]]
        if failed:
            raise DistError(
                "; ".join(f"rank {r} failed: {m}" for r, m in failed)
                if world.size > 1
                else failed[0][1],
                shared=True,
            )
        if merger is not None:
            samples = list(ready)
            for r in range(1, world.size):
                samples += decode(got[r][0], p.prompts, n, f"rank {r}")
            appended = merger.add(samples)
            merger.generated += sum(c[1] for _, c in got)
            merger.prefilled += sum(c[2] for _, c in got)
            if progress is not None:
                gen_round = sum(c[1] for _, c in got)
                pre_round = sum(c[2] for _, c in got)
                progress(Step(appended, gen_round, pre_round, 0), merger.writer.count, p.total)
        if all(c[0] for _, c in got):
            return


class _Merger:
    """Rank 0's side: the log writer, the spool, and the samples waiting for predecessors.

    A new log reaches its place with its first records (bi_rl.rollout.log.LogWriter); until
    then waiting samples stay in memory, so that a run stopped before its first record
    leaves nothing behind (and, replacing a log, leaves that log as it was)."""

    def __init__(self, cfg, p: Plan, writer: LogWriter, spool: Spool, replacing: bool, ranks):
        self.cfg, self.plan, self.writer, self.spool = cfg, p, writer, spool
        self.replacing, self.ranks = replacing, ranks
        self.n = p.engine.config.n
        self.waiting: dict[int, Sample] = {}
        self.spooled: set[int] = set()  # waiting units already in the spool
        self.start = writer.count
        self.generated = self.prefilled = 0
        self.t0 = time.perf_counter()

    @classmethod
    def open(cls, cfg: RolloutConfig, p: Plan, out, replacing: bool, ranks: int) -> _Merger:
        writer = open_log(cfg, out, p.header, replacing)
        spool = Spool(out, p.header, p.engine.config.n)
        m = cls(cfg, p, writer, spool, replacing, ranks)
        if cfg.resume:
            waiting = spool.read(writer.header, p.prompts)
            m.waiting = {u: s for u, s in waiting.items() if u >= writer.count}
            m.spooled = set(m.waiting)
            m._append_ready()
        else:
            spool.remove()  # a fresh run: a spool left by an earlier one is stale
        return m

    def done_mask(self, total: int) -> np.ndarray:
        done = np.zeros(total, dtype=bool)
        done[: self.writer.count] = True
        done[list(self.waiting)] = True
        return done

    def _append_ready(self) -> list[Sample]:
        ready = []
        while self.writer.count + len(ready) in self.waiting:
            u = self.writer.count + len(ready)
            ready.append(self.waiting.pop(u))
            self.spooled.discard(u)
        write_samples(self.writer, ready, self.replacing)
        return ready

    def add(self, samples: list[Sample]) -> list[Sample]:
        """Take finished samples from any rank; append what continues the log, spool the
        rest once the log is in place. Returns the samples appended."""
        for s in samples:
            u = s.prompt_index * self.n + s.sample
            if u < self.writer.count or u in self.waiting:
                raise DistError(f"sample {s.unit} arrived twice (a bug in the split)")
            self.waiting[u] = s
        appended = self._append_ready()
        if self.writer.in_place:
            new = sorted(set(self.waiting) - self.spooled)
            self.spool.append([self.waiting[u] for u in new])
            self.spooled.update(new)
        return appended

    def _summary(self, incomplete: str | None) -> RunSummary:
        seconds = time.perf_counter() - self.t0
        resumed_from = self.start if self.cfg.resume else None
        s = run_summary(
            self.writer.path,
            self.writer.count,
            resumed_from,
            self.generated,
            self.prefilled,
            seconds,
            self.cfg.engine,
        )
        return replace(s, ranks=self.ranks, incomplete=incomplete)

    def _record(self, summary: RunSummary) -> None:
        out = self.writer.path
        earlier = Sidecar.read(out).runs if self.cfg.resume else ()
        Sidecar((*earlier, summary)).write(out)

    def stopped(self, why: str) -> str:
        """Record the run as incomplete; the text to add to the error message."""
        self.writer.close()
        self.spool.close()
        if not self.writer.in_place:  # no record came: no log, nothing to record
            return f"; nothing was written to {self.cfg.out}"
        self._record(self._summary(why))
        return (
            f"; the log holds {self.writer.count} of {self.plan.total} records "
            f"({len(self.spooled)} more wait in {self.spool.path.name}); continue with "
            "--resume, on any number of ranks"
        )

    def stop_note(self) -> str:
        """What the watchdog runs before it ends a rank whose peers went away."""
        return self.stopped("no answer from the other ranks (a rank or its host went away)")

    def finish(self) -> RunSummary:
        if self.writer.count != self.plan.total:
            raise DistError(
                f"the run ended with {self.writer.count} of {self.plan.total} records in the "
                f"log and {len(self.waiting)} waiting (a bug); continue with --resume"
            )
        self.writer.close()
        self.spool.remove()
        summary = self._summary(None)
        self._record(summary)
        return summary
