"""Writing, reading, verifying and resuming rollout logs (the format: bi_rl.rollout.schema).

A log is append-only: `LogWriter` writes the header once, then appends each batch of
finished samples as chained records and flushes them. A new log is written aside (a hidden
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
from collections.abc import Iterator
from pathlib import Path

import orjson

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
    "LogError",
    "LogWriter",
    "check_resumable",
    "iter_records",
    "open_for_resume",
    "read_header",
    "read_lines",
    "read_log",
]


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
    if complete:
        return LogError(
            path, lineno, f"the {what} lacks its final newline (LF); its JSON is complete"
        )
    return LogError(path, lineno, f"truncated {what} (the run was killed mid-write)")


def read_header(path) -> RunHeader:
    """The header of the log at `path`, checked (format, version, digest, genesis, fields,
    byte form)."""
    path = Path(path)
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
    `replace`. With `prev` and `count` the writer continues the existing log at `path`.
    """

    def __init__(
        self,
        path,
        header: RunHeader,
        *,
        prev: str | None = None,
        count: int = 0,
        replace: bool = False,
    ):
        self.path = Path(path)
        self.header = header
        self.count = count
        self.replace = replace
        self._aside: Path | None = None
        self.in_place = prev is not None  # a new log gets to `path` with its first records
        if prev is None:
            self._refuse_existing()
            self._aside = self.path.with_name(f".{self.path.name}.{os.getpid()}.partial")
            with open(self._aside, "xb") as f:
                f.write(canon(header.to_json()) + b"\n")
            prev = header.genesis
        self.prev = prev
        self._f = open(self._aside or self.path, "ab")  # noqa: SIM115 - closed in close()

    def _refuse_existing(self) -> None:
        if not self.replace and self.path.exists():
            raise FileExistsError(f"{self.path} already exists")

    def write(self, samples) -> None:
        """Append samples (in canonical order) and flush them to the OS."""
        if not samples:
            return
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

    def close(self) -> None:
        if not self._f.closed:
            self._f.flush()
            os.fsync(self._f.fileno())
            self._f.close()
        if self._aside is not None:  # no record ever came: leave nothing behind
            self._aside.unlink(missing_ok=True)
            self._aside = None

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


def open_for_resume(path, header: RunHeader, *, ignore_env=("model_path",)) -> LogWriter:
    """A writer continuing the log at `path`, which an identical run started.

    Refuses a missing or empty file (there is nothing to resume) and a header that differs
    from `header` (naming the fields; env fields in `ignore_env` may differ); verifies every
    complete record (chain, byte form) and that records are the canonical prefix; only then
    drops a torn last line, and returns a writer positioned after the records (`.count`
    records done). A refused log is left exactly as it was.
    """
    path = Path(path)
    check_resumable(path)
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
        with open(path, "r+b") as f:
            f.truncate(cut)
    return LogWriter(path, old, prev=prev, count=count)
