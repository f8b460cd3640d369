"""Writing, reading, verifying and resuming rollout logs (the format: bi_rl.rollout.schema).

A log is append-only: `LogWriter` writes the header once, then appends each batch of
finished samples as chained records and flushes them. A run killed mid-way is continued
with `open_for_resume`, which drops a torn last line, checks the header, verifies the chain,
and returns where to continue; the finished file is byte-identical to an uninterrupted run.
Run-specific facts (batch size, timings, throughput) never enter the log: they go to its
sidecar (`bi_rl.rollout.schema.Sidecar`).

Reader API: `read_header(path)` (a checked `RunHeader`), `iter_records(path, verify=True)`,
`read_log(path)`, each raising `LogError` that names the line, and the token where it
applies.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import orjson

from bi_rl.rollout.schema import (
    LogError,
    LogRecord,
    RunHeader,
    canon,
    chain_record,
    differing_fields,
)

__all__ = [
    "LogError",
    "LogWriter",
    "iter_records",
    "open_for_resume",
    "read_header",
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


def _verify(path, lineno: int, rec: LogRecord, prev: str) -> None:
    hashes, end = chain_record(prev, rec)
    for i, (want, got) in enumerate(zip(hashes, rec.hashes, strict=True)):
        if want != got:
            raise LogError(path, lineno, "hash chain broken", token=i)
    if end != rec.hash:
        raise LogError(path, lineno, "record hash does not close the chain")


def _lines(path) -> Iterator[tuple[int, bytes, bool]]:
    """(line number, bytes, complete) for each line; only the last may be incomplete."""
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, start=1):
            yield lineno, raw, raw.endswith(b"\n")


def read_header(path) -> RunHeader:
    """The header of the log at `path`, checked (format, version, digest, genesis, fields)."""
    path = Path(path)
    if not path.is_file():
        raise LogError(path, None, "no such log file")
    for lineno, raw, complete in _lines(path):
        if not complete:
            raise LogError(path, lineno, "truncated header line")
        return RunHeader.from_json(_parse(path, lineno, raw), path)
    raise LogError(path, None, "empty log")


def iter_records(path, *, verify: bool = True, allow_torn: bool = False) -> Iterator[LogRecord]:
    """Yield the log's records in order, checking form and (with verify) the hash chain.

    A last line without its newline is a torn write: an error unless allow_torn, in which
    case it is skipped. Raises LogError naming the first bad line (and token).
    """
    prev = read_header(path).genesis
    for lineno, raw, complete in _lines(path):
        if lineno == 1:
            continue
        if not complete:
            if allow_torn:
                return
            raise LogError(path, lineno, "truncated last line (the run was killed mid-write)")
        rec = LogRecord.from_json(_parse(path, lineno, raw), path, lineno)
        if verify:
            _verify(path, lineno, rec, prev)
        prev = rec.hash
        yield rec


def read_log(path, *, verify: bool = True) -> tuple[RunHeader, list[LogRecord]]:
    """(header, records) of a complete log."""
    return read_header(path), list(iter_records(path, verify=verify))


# -- writing ------------------------------------------------------------------------------


class LogWriter:
    """Appends chained records to a log file; `write` flushes each batch."""

    def __init__(self, path, header: RunHeader, *, prev: str | None = None, count: int = 0):
        self.path = Path(path)
        self.header = header
        self.count = count
        if prev is None:
            with open(self.path, "xb") as f:
                f.write(canon(header.to_json()) + b"\n")
            prev = header.genesis
        self.prev = prev
        self._f = open(self.path, "ab")  # noqa: SIM115 - closed in close()

    def write(self, samples) -> None:
        """Append samples (in canonical order) and flush them to the OS."""
        if not samples:
            return
        buf = bytearray()
        for s in samples:
            rec = LogRecord.chained(s, self.prev)
            buf += canon(rec.to_json()) + b"\n"
            self.prev = rec.hash
        self._f.write(buf)
        self._f.flush()
        self.count += len(samples)

    def close(self) -> None:
        if not self._f.closed:
            self._f.flush()
            os.fsync(self._f.fileno())
            self._f.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def open_for_resume(path, header: RunHeader, *, ignore_env=("model_path",)) -> LogWriter:
    """A writer continuing the log at `path`, which an identical run started.

    Drops a torn last line, refuses a header that differs from `header` (naming the fields;
    env fields in `ignore_env` may differ), verifies every record's chain and that records
    are the canonical prefix, and returns a writer positioned after them (`.count` records
    done). A missing or empty file starts a new log.
    """
    path = Path(path)
    if not path.exists() or path.stat().st_size == 0:
        if path.exists():
            path.unlink()
        return LogWriter(path, header)
    with open(path, "rb") as f:
        data = f.read()
    cut = data.rfind(b"\n") + 1
    if cut == 0:
        raise LogError(path, 1, "truncated header line; remove the file to start again")
    old = read_header(path)

    def strip(h: RunHeader) -> dict:
        j = h.to_json()
        return {**j, "env": {k: v for k, v in j["env"].items() if k not in ignore_env}}

    diff = differing_fields(strip(old), strip(header))
    diff = [d for d in diff if d not in ("digest", "genesis")]  # derived fields
    if diff:
        raise LogError(path, 1, f"cannot resume: header differs in {', '.join(diff)}")
    if cut < len(data):
        with open(path, "r+b") as f:
            f.truncate(cut)
    prev, count = old.genesis, 0
    n = old.run.n
    for rec in iter_records(path):
        if (rec.prompt_index, rec.sample) != divmod(count, n):
            raise LogError(path, count + 2, "records are not in canonical order")
        prev = rec.hash
        count += 1
    return LogWriter(path, old, prev=prev, count=count)
