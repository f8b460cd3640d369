"""Writing, reading, verifying and resuming rollout logs (the format: bi_rl.rollout.schema).

A log is append-only: `LogWriter` writes the header once, then appends each batch of
finished samples as chained records and flushes them (optionally from a thread of its own,
off the generating thread's path, with the same bytes). A new log is written aside (a hidden
file in the same directory) and put in place by an atomic rename with its first records, so
a run that fails or is stopped before its first sample leaves no header-only log and, with
`replace`, leaves the log it would have replaced untouched. A run killed mid-way is
continued with `open_for_resume`, which verifies the log, drops a torn last line, checks the
header, and returns where to continue; the finished file is byte-identical to an
uninterrupted run. Run-specific facts (batch size, timings, throughput) never enter the log:
they go to its sidecar (`bi_rl.rollout.schema.Sidecar`).

Reader API: `read_header(path)` (a checked `RunHeader`), `iter_records(path, verify=True)`,
`read_log(path)`, each raising `LogError` that names the line, and the token where it
applies. Readers accept only the canonical byte form and read at most
`schema.MAX_LINE_BYTES` of any line.
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import orjson

from bi_rl import _lock
from bi_rl.rollout import schema
from bi_rl.rollout.schema import (
    LogError,
    LogRecord,
    RunHeader,
    canon,
    chain_record,
    differing_fields,
    line_form_error,
)

__all__ = [
    "BUSY",
    "LogError",
    "LogWriter",
    "check_resumable",
    "iter_records",
    "open_for_resume",
    "read_header",
    "read_lines",
    "read_log",
]


# What a second writer of a log is told (bi_rl._lock: one writer per log).
BUSY = "another process is writing this log (a run in progress); wait for it to end"

# -- reading ------------------------------------------------------------------------------


def _parse(path, lineno: int, raw: bytes) -> dict:
    try:
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        raise LogError(path, lineno, f"not valid JSON ({e.msg})") from None
    if not isinstance(obj, dict):
        raise LogError(path, lineno, "expected a JSON object")
    return obj


def _check_form(path, lineno: int, raw: bytes, obj: dict) -> None:
    problem = line_form_error(raw, obj)
    if problem is not None:
        raise LogError(path, lineno, problem)


def _verify(path, lineno: int, rec: LogRecord, prev: str) -> None:
    hashes, end = chain_record(prev, rec)
    for i, (want, got) in enumerate(zip(hashes, rec.hashes, strict=True)):
        if want != got:
            raise LogError(path, lineno, "hash chain broken", token=i)
    if end != rec.hash:
        raise LogError(path, lineno, "record hash does not close the chain")


def read_lines(path) -> Iterator[tuple[int, bytes, bool]]:
    """(line number, bytes, complete) for each line; only the last may be incomplete.

    Reads at most schema.MAX_LINE_BYTES of a line: a longer one raises LogError at once.
    """
    limit = schema.MAX_LINE_BYTES
    with open(path, "rb") as f:
        lineno = 0
        while raw := f.readline(limit + 1):
            lineno += 1
            if len(raw) > limit:
                raise LogError(
                    path,
                    lineno,
                    f"line is longer than the limit of {limit} bytes a log line may hold "
                    "(not a bi-rl log line)",
                )
            yield lineno, raw, raw.endswith(b"\n")


def _torn(path, lineno: int, raw: bytes, what: str) -> LogError:
    """The error for a last line without its LF: torn mid-write, or complete but unended."""
    try:
        complete = isinstance(orjson.loads(raw), dict)
    except orjson.JSONDecodeError:
        complete = False
    if _lock.held_elsewhere(path):  # not torn: the writer is between two writes
        return LogError(path, lineno, f"the {what} is being written: {BUSY}")
    if complete:
        return LogError(
            path, lineno, f"the {what} lacks its final newline (LF); its JSON is complete"
        )
    return LogError(path, lineno, f"truncated {what} (the run was killed mid-write)")


def read_header(path) -> RunHeader:
    """The header of the log at `path`, checked (format, version, digest, genesis, fields,
    byte form)."""
    path = Path(path)
    if path.is_dir():
        raise LogError(path, None, "is a directory, not a log file")
    if not path.is_file():
        raise LogError(path, None, "no such log file")
    for lineno, raw, complete in read_lines(path):
        if not complete:
            raise _torn(path, lineno, raw, "header line")
        obj = _parse(path, lineno, raw)
        header = RunHeader.from_json(obj, path)
        _check_form(path, lineno, raw, obj)
        return header
    raise LogError(path, None, "empty log")


def iter_records(path, *, verify: bool = True, allow_torn: bool = False) -> Iterator[LogRecord]:
    """Yield the log's records in order, checking form, byte form and (with verify) the
    hash chain.

    A last line without its newline is a torn write: an error unless allow_torn, in which
    case it is skipped. Raises LogError naming the first bad line (and token).
    """
    prev = read_header(path).genesis
    for lineno, raw, complete in read_lines(path):
        if lineno == 1:
            continue
        if not complete:
            if allow_torn:
                return
            raise _torn(path, lineno, raw, "last line")
        obj = _parse(path, lineno, raw)
        rec = LogRecord.from_json(obj, path, lineno)
        if verify:
            _verify(path, lineno, rec, prev)
        _check_form(path, lineno, raw, obj)
        prev = rec.hash
        yield rec


def read_log(path, *, verify: bool = True) -> tuple[RunHeader, list[LogRecord]]:
    """(header, records) of a complete log."""
    return read_header(path), list(iter_records(path, verify=verify))


# -- writing ------------------------------------------------------------------------------


class LogWriter:
    """Appends chained records to a log file; `write` flushes each batch.

    A new log (prev None) is written aside, in a hidden file beside `path`, and renamed onto
    `path` by the first `write` that brings records; closed before that (or left by an
    exception), it is removed and `path` is untouched. `path` must not exist unless
    `replace`. With `prev` and `count` the writer continues the existing log at `path`
    (through `file`, where the caller opened and locked it already).

    The writer holds the log's write lock (bi_rl._lock) from opening to `close`, the aside
    file's lock becoming the log's with the rename; a log that another process holds is
    refused (LogError, BUSY), and so is replacing one.

    With `background=True` a thread does the hashing, encoding and writing: `write` hands it
    the samples and returns at once, the thread appends them in the order given, and `close`
    waits until everything handed over is written (a failure in the thread is raised by the
    next `write` or by `close`). The bytes are the same either way. `header` may then be a
    function returning it, which the thread calls before it writes anything, so a run can
    generate while the header's digests are still being computed. `on_in_place` is called
    (from the writing thread, in the background) right after a new log is renamed onto
    `path`.
    """

    def __init__(
        self,
        path,
        header: RunHeader | Callable[[], RunHeader],
        *,
        prev: str | None = None,
        count: int = 0,
        replace: bool = False,
        background: bool = False,
        on_in_place: Callable[[], None] | None = None,
        file=None,
    ):
        self.path = Path(path)
        if callable(header) and not background:
            header = header()
        self._header = header
        self.count = count  # records in the file (background: written so far)
        self.submitted = count  # records handed to `write`
        self.replace = replace
        self.on_in_place = on_in_place
        self._aside: Path | None = None
        self.in_place = prev is not None  # a new log gets to `path` with its first records
        if prev is None:
            self._refuse_existing()
            self._aside = self.path.with_name(f".{self.path.name}.{os.getpid()}.partial")
        self.prev = prev
        if file is None:
            file = open(self._aside or self.path, "xb" if prev is None else "ab")  # noqa: SIM115
            if not _lock.take(file):
                file.close()
                raise LogError(self.path, None, BUSY)
        self._f = file
        self._error: BaseException | None = None
        self._queue: queue.SimpleQueue | None = None
        self._thread = None
        if background:
            self._queue = queue.SimpleQueue()
            self._thread = threading.Thread(target=self._drain, daemon=True)
            self._thread.start()
        elif prev is None:
            self._start()

    @property
    def header(self) -> RunHeader:
        if callable(self._header):
            raise RuntimeError("the header is not known yet")
        return self._header

    def _refuse_existing(self) -> None:
        if not self.replace and self.path.exists():
            raise FileExistsError(f"{self.path} already exists")
        if _lock.held_elsewhere(self.path):  # replacing a log another run is writing
            raise LogError(self.path, None, BUSY)

    def _start(self) -> None:
        """Write the header of a new log (aside)."""
        if callable(self._header):
            self._header = self._header()
        self._f.write(canon(self._header.to_json()) + b"\n")
        self.prev = self._header.genesis

    def _append(self, samples) -> None:
        buf = bytearray()
        prev = self.prev
        for s in samples:
            rec = LogRecord.chained(s, prev)
            buf += canon(rec.to_json()) + b"\n"
            prev = rec.hash
        self._f.write(buf)
        self._f.flush()
        self.prev = prev
        self.count += len(samples)
        if self._aside is not None:
            self._put_in_place()

    def _put_in_place(self) -> None:
        os.fsync(self._f.fileno())
        self._refuse_existing()
        os.replace(self._aside, self.path)
        self._aside, self.in_place = None, True
        _fsync_dir(self.path.parent)
        if self.on_in_place is not None:
            self.on_in_place()

    def _drain(self) -> None:
        try:
            if self.prev is None:
                self._start()
            while True:
                batch = [self._queue.get()]
                while not self._queue.empty():  # whatever else is waiting: one write
                    batch.append(self._queue.get())
                last = None in batch  # close() asked: what came before it is the rest
                if last:
                    batch = batch[: batch.index(None)]
                samples = [s for b in batch for s in b]
                if samples:
                    self._append(samples)
                if last:
                    return
        except BaseException as e:  # raised again by write() or close()
            self._error = e

    def _check(self) -> None:
        if self._error is not None:
            raise self._error

    def write(self, samples) -> None:
        """Append samples (in canonical order) and flush them to the OS (background: hand
        them to the writing thread)."""
        if not samples:
            return
        if self._queue is None:
            self._append(samples)
        else:
            self._check()
            self._queue.put(list(samples))
        self.submitted += len(samples)

    def close(self) -> None:
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join()
            self._thread = None
        if not self._f.closed:
            self._f.flush()
            os.fsync(self._f.fileno())
            _lock.forget(self._f)
            self._f.close()
        if self._aside is not None:  # no record ever came: leave nothing behind
            self._aside.unlink(missing_ok=True)
            self._aside = None
        self._check()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _fsync_dir(folder: Path) -> None:
    """Make a rename in `folder` durable (where the platform lets a directory be opened)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _end_of_last_line(path: Path) -> int:
    """The offset just past the file's last LF (0 if it has none), read from the end."""
    with open(path, "rb") as f:
        end = f.seek(0, os.SEEK_END)
        while end > 0:
            start = max(0, end - (1 << 16))
            f.seek(start)
            block = f.read(end - start)
            i = block.rfind(b"\n")
            if i >= 0:
                return start + i + 1
            end = start
    return 0


def check_resumable(path) -> None:
    """LogError unless `path` holds something to resume: a missing or empty file does not."""
    path = Path(path)
    if not path.exists():
        raise LogError(path, None, "no such file: nothing to resume (run without --resume)")
    if path.is_file() and path.stat().st_size == 0:
        raise LogError(
            path, None, "the file is empty: nothing to resume (run without --resume to start it)"
        )


def open_for_resume(
    path, header: RunHeader, *, ignore_env=("model_path",), background: bool = False
) -> LogWriter:
    """A writer continuing the log at `path`, which an identical run started.

    Refuses a missing or empty file (there is nothing to resume) and a header that differs
    from `header` (naming the fields; env fields in `ignore_env` may differ); verifies every
    complete record (chain, byte form) and that records are the canonical prefix; only then
    drops a torn last line, and returns a writer positioned after the records (`.count`
    records done). A refused log is left exactly as it was. The log's write lock is taken
    before any of it is read, so a log another process is writing is refused (BUSY) and two
    resumers never both trim and continue it. background: as for LogWriter.
    """
    path = Path(path)
    check_resumable(path)
    f = open(path, "ab")  # noqa: SIM115 - the writer's file: locked before anything is read
    if not _lock.take(f):
        f.close()
        raise LogError(path, None, BUSY)
    try:
        old = read_header(path)

        def strip(h: RunHeader) -> dict:
            j = h.to_json()
            return {**j, "env": {k: v for k, v in j["env"].items() if k not in ignore_env}}

        diff = differing_fields(strip(old), strip(header))
        diff = [d for d in diff if d not in ("digest", "genesis")]  # derived fields
        if diff:
            raise LogError(path, 1, f"cannot resume: header differs in {', '.join(diff)}")
        prev, count = old.genesis, 0
        n = old.run.n
        for rec in iter_records(path, allow_torn=True):
            if (rec.prompt_index, rec.sample) != divmod(count, n):
                raise LogError(path, count + 2, "records are not in canonical order")
            prev = rec.hash
            count += 1
        cut = _end_of_last_line(path)
        if cut < path.stat().st_size:
            f.truncate(cut)
        return LogWriter(path, old, prev=prev, count=count, background=background, file=f)
    except BaseException:
        _lock.forget(f)
        f.close()
        raise
