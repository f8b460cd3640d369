"""The ranks of a data-parallel run and the few exact collectives bi-rl needs between them.

A process started by `mlx.launch` (ring or NCCL backend) or by `mpirun` finds its group in
the environment those launchers set; any other process is a world of one and never touches
`mx.distributed`. Everything that crosses between ranks here is bytes or unsigned integers
(`exchange`, `agree`, `sum_u32`), so no floating-point reduction order enters a result:
a rank's records and scores travel bit for bit, and rank 0 computes whatever a single
process would from them.

A rank that dies makes its peers' next collective fail (the ring backend raises "connection
to a peer was lost"; `mlx.launch` also terminates the survivors). A host that goes away
silently, or a rank that hangs, would block them forever: each collective is therefore
watched, and a rank that waits longer than `timeout` seconds reports it, runs the cleanup
its caller registered (`on_timeout`) and exits with EXIT_RANK_LOST. Collectives made while
the ranks start (`setup=True`: each rank loads and hashes the model before it) wait at
least DEFAULT_RANK_TIMEOUT, whatever shorter `timeout` a run sets for its rounds.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np

__all__ = [
    "DEFAULT_RANK_TIMEOUT",
    "EXIT_RANK_LOST",
    "DistError",
    "Terminated",
    "World",
    "launch_backend",
    "sigterm_raises",
    "stopping",
]

# How long a rank waits in one collective before it declares its peers gone. A collective
# also waits for the slowest rank's work since the last one (model loading and hashing at
# the start, the first CUDA kernel compilation), so this is generous.
DEFAULT_RANK_TIMEOUT = 600.0
EXIT_RANK_LOST = 3  # the exit status of a rank that lost its peers (the run can be resumed)

# The variables each launcher sets, and the MLX backend it implies.
_LAUNCH_ENV = (
    ("nccl", ("NCCL_HOST_IP", "MLX_WORLD_SIZE", "MLX_RANK")),
    ("ring", ("MLX_HOSTFILE", "MLX_RANK")),
    ("jaccl", ("MLX_JACCL_COORDINATOR", "MLX_RANK")),
    ("mpi", ("OMPI_COMM_WORLD_SIZE",)),
    ("mpi", ("PMI_SIZE",)),
)


class DistError(RuntimeError):
    """A distributed run that cannot go on; the message is one line.

    `shared` is True when every rank raised the same error (so one rank reporting it is
    enough), False when only this rank knows it; `lost` when a collective failed because a
    rank or its host went away.
    """

    def __init__(self, message: str, shared: bool = False, lost: bool = False):
        super().__init__(message)
        self.shared, self.lost = shared, lost


def report_error(prog: str, e: DistError, world: World | None) -> None:
    """Say a DistError on stderr as `prog: error: ...` where it belongs: once, on rank 0, for
    an error every rank shares (then wait for the other ranks, World.leave_together, so a
    launcher does not cut rank 0 off first), on each rank for an error only it knows."""
    if world is None or world.rank == 0 or not e.shared:
        print(f"{prog}: error: {e}", file=sys.stderr)
    if world is not None and e.shared:
        world.leave_together()


class Terminated(BaseException):
    """SIGTERM arrived: `mlx.launch` stops every rank this way when one of them fails."""


_stopping = threading.Event()  # set once a rank records why it stops: SIGTERM is ignored


@contextmanager
def sigterm_raises() -> Iterator[None]:
    """Inside, SIGTERM raises Terminated in the main thread (so rank 0 can say how far the
    log got before it exits), until `stopping()` is called; the previous handler is
    restored on leaving."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        # At most one Terminated: the first SIGTERM raises it and marks the rank as stopping,
        # so a second cannot cut short the handling of the first.
        if not _stopping.is_set():
            _stopping.set()
            raise Terminated("stopped by SIGTERM (the launcher stops every rank when one fails)")

    _stopping.clear()
    old = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)
        _stopping.clear()


def stopping() -> None:
    """This rank is recording why it stops (the sidecar, the message) and exits next: from
    now until `sigterm_raises` is left, a SIGTERM from the launcher must not cut that short.

    The launcher's SIGTERM often lands while the exception that stops the rank is still
    being handled, and Python raises it at the first call there, which is this one: callers
    catch Terminated around it and go on with the exception they were handling (the handler
    has marked the rank as stopping before raising)."""
    _stopping.set()


def launch_backend(environ=os.environ) -> str | None:
    """The MLX distributed backend a launcher started this process for, or None.

    `mlx.launch` with a one-host ring sets an empty hostfile: a world of one, None here.
    """
    for backend, names in _LAUNCH_ENV:
        if all(environ.get(n) for n in names):
            if backend == "ring" and not _hostfile_has_peers(environ["MLX_HOSTFILE"]):
                return None
            return backend
    return None


def _hostfile_has_peers(path: str) -> bool:
    try:
        with open(path, "rb") as f:
            return bool(f.read().strip())
    except OSError:
        return True  # let MLX report the unreadable file


class _Watchdog:
    """Exits the process when a collective has waited longer than its deadline."""

    def __init__(self, world: World):
        self.world = world
        self.cond = threading.Condition()
        self.what: str | None = None
        self.seconds = self.deadline = 0.0
        self.thread: threading.Thread | None = None

    def arm(self, what: str, seconds: float) -> None:
        with self.cond:
            self.what, self.seconds = what, seconds
            self.deadline = time.monotonic() + seconds
            if self.thread is None:
                self.thread = threading.Thread(target=self._run, name="bi-rl-watchdog")
                self.thread.daemon = True
                self.thread.start()
            self.cond.notify()

    def disarm(self) -> None:
        with self.cond:
            self.what = None
            self.cond.notify()

    def _run(self) -> None:
        with self.cond:
            while True:
                if self.what is None:
                    self.cond.wait()
                    continue
                left = self.deadline - time.monotonic()
                if left > 0:
                    self.cond.wait(left)
                    continue
                self._fire(self.what, self.seconds)

    def _fire(self, what: str, seconds: float) -> None:
        w = self.world
        message = (
            f"rank {w.rank}: no answer from the other ranks for {seconds:g} s ({what}); "
            "a rank or its host went away"
        )
        for cleanup in w.on_timeout:
            try:
                message += cleanup()
            except Exception as e:  # the exit below must happen whatever cleanup does
                message += f" (cleanup failed: {e})"
        print(f"bi-rl: error: {message}", file=sys.stderr, flush=True)
        os._exit(EXIT_RANK_LOST)


@dataclass
class World:
    """This process's place in a data-parallel run: rank, size, and exact collectives.

    `World()` is a world of one (every collective returns this rank's own input);
    `World.join()` joins the group a launcher set up, if any.
    """

    rank: int = 0
    size: int = 1
    backend: str | None = None
    timeout: float = DEFAULT_RANK_TIMEOUT
    group: object = None
    stream: object = None
    # Called by the watchdog before it exits; each returns text appended to its message.
    on_timeout: list[Callable[[], str]] = field(default_factory=list)

    def __post_init__(self):
        if self.timeout <= 0:
            raise ValueError(f"the rank timeout must be > 0 seconds, got {self.timeout:g}")
        self._watch = _Watchdog(self)

    @classmethod
    def join(cls, timeout: float = DEFAULT_RANK_TIMEOUT) -> World:
        """The world the environment describes: the launcher's group, or a world of one."""
        backend = launch_backend()
        if backend is None:
            return cls(timeout=timeout)
        import mlx.core as mx

        world = cls(backend=backend, timeout=timeout)
        world._watch.arm(f"joining the {backend} group", world._patience(True))
        try:
            group = mx.distributed.init(strict=True, backend=backend)
        except RuntimeError as e:
            raise DistError(f"cannot join the {backend} group: {e}") from None
        finally:
            world._watch.disarm()
        world.group, world.rank, world.size = group, group.rank(), group.size()
        # NCCL moves device memory; the other backends move host memory.
        world.stream = mx.gpu if backend == "nccl" else mx.cpu
        return world

    # -- collectives --------------------------------------------------------------------

    def _patience(self, setup: bool) -> float:
        return max(self.timeout, DEFAULT_RANK_TIMEOUT) if setup else self.timeout

    def _collective(self, what: str, op: Callable, x: np.ndarray, setup: bool) -> np.ndarray:
        import mlx.core as mx

        self._watch.arm(what, self._patience(setup))
        try:
            out = op(mx.array(x), group=self.group, stream=self.stream)
            mx.eval(out)
            return np.array(out)
        except RuntimeError as e:
            raise DistError(
                f"rank {self.rank}: {what} failed ({str(e).strip()}); a rank or its host went away",
                lost=True,
            ) from None
        finally:
            self._watch.disarm()

    def exchange(
        self, payload: bytes, counts: list[int], what: str = "exchange", setup: bool = False
    ) -> list[tuple[bytes, list[int]]]:
        """Every rank's (payload, counts), in rank order, on every rank.

        counts: unsigned 32-bit integers, the same number on every rank. Two all_gathers: the
        sizes and counts, then the payloads padded to the longest (MLX's all_gather needs
        equal shapes on every rank). setup: the ranks may still be loading the model.
        """
        if self.size == 1:
            return [(payload, list(counts))]
        import mlx.core as mx

        head = np.array([len(payload), *counts], dtype=np.uint32)
        heads = self._collective(f"{what} (sizes)", mx.distributed.all_gather, head, setup)
        heads = heads.reshape(self.size, len(head))
        longest = int(heads[:, 0].max())
        if longest == 0:
            return [(b"", h[1:].tolist()) for h in heads]
        buf = np.zeros(longest, dtype=np.uint8)
        buf[: len(payload)] = np.frombuffer(payload, dtype=np.uint8)
        data = self._collective(what, mx.distributed.all_gather, buf, setup)
        data = data.reshape(self.size, longest)
        return [
            (data[r, : int(heads[r, 0])].tobytes(), heads[r, 1:].tolist()) for r in range(self.size)
        ]

    def gather_bytes(
        self, payload: bytes, what: str = "gather", setup: bool = False
    ) -> list[bytes]:
        """Every rank's bytes, in rank order."""
        return [p for p, _ in self.exchange(payload, [], what, setup)]

    def agree(self, error: str | None, what: str, setup: bool = False) -> None:
        """Raise DistError on every rank if any rank reports an error (None: this one is fine).

        The message names the ranks that failed and what they said, the same on every rank.
        """
        said = self.gather_bytes((error or "").encode(), f"agreeing on {what}", setup)
        failed = [(r, m.decode()) for r, m in enumerate(said) if m]
        if not failed:
            return
        if self.size == 1:
            raise DistError(failed[0][1], shared=True)
        texts = list(dict.fromkeys(m for _, m in failed))
        if len(texts) == 1:
            ranks = ", ".join(str(r) for r, _ in failed)
            word = "rank" if len(failed) == 1 else "ranks"
            raise DistError(f"{word} {ranks}: {texts[0]}", shared=True)
        raise DistError("; ".join(f"rank {r}: {m}" for r, m in failed), shared=True)

    def leave_together(self) -> None:
        """Wait for every rank before exiting after an error all of them share, so that
        rank 0 has reported it before a launcher, seeing another rank exit with an error,
        terminates rank 0. Quietly does nothing if a rank is already gone."""
        if self.size == 1:
            return
        try:
            self.exchange(b"", [], "leaving together")
        except DistError:
            pass

    def sum_u32(self, x: np.ndarray, what: str = "sum") -> np.ndarray:
        """The elementwise sum over ranks of a uint32 array (exact; callers keep it in range)."""
        x = np.ascontiguousarray(x, dtype=np.uint32)
        if self.size == 1 or x.size == 0:
            return x.copy()
        import mlx.core as mx

        return self._collective(what, mx.distributed.all_sum, x, False).astype(np.uint32)
