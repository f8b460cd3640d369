"""bi-verify --log: each finished check appended to a JSON-lines file as it completes.

A full sweep on a GPU takes long (every attention instantiation is compiled at first use on a
new machine), so a run can be cut short by a time limit or a killed process. With a log the
checks it finished are kept, and `--resume` continues the sweep without running them again;
the final report then holds every check, old and new, exactly as one uninterrupted run would.

The first line says what the log belongs to (source digest, backend, device, MLX version,
sweep kind); a log made by other code or on another machine is refused, never mixed in. Each
further line is one check: {"opset", "index" (its place in the plan), "label", "check"}. A
last line cut off mid-write (the process was killed) is dropped when the log is resumed.
One sweep writes a log at a time (bi_rl._lock): a second one, resuming or not, is refused
before it reads or trims anything.
"""

from __future__ import annotations

from pathlib import Path

import orjson

from bi_rl import _lock
from bi_rl.verify.core import Check

FORMAT = 1


class SweepLogError(ValueError):
    """A log that cannot be used: it exists without --resume, or belongs to another sweep."""


class SweepLog:
    """The log at `path` for a sweep described by `meta`; `done` holds its finished checks."""

    def __init__(self, path: str | Path, meta: dict, resume: bool):
        self.path = Path(path)
        self.header = {"bi_verify_log": FORMAT, **meta}
        self.done: dict[tuple[str, int], Check] = {}
        if self.path.is_dir():
            raise SweepLogError(f"{self.path} is a directory")
        existing = self.path.is_file() and self.path.stat().st_size > 0
        if existing and not resume:
            raise SweepLogError(
                f"{self.path} exists: --resume continues that sweep; give another path to "
                "start anew"
            )
        self._file = open(self.path, "ab")  # noqa: SIM115 - held open for the sweep's length
        if not _lock.take(self._file):
            self._file.close()
            raise SweepLogError(f"{self.path}: another bi-verify is writing this log")
        try:
            if existing:
                self._read()
            else:
                self._write(self.header)
        except BaseException:
            self.close()
            raise

    def _read(self) -> None:
        data = self.path.read_bytes()
        complete = data[: data.rfind(b"\n") + 1]  # a line cut off mid-write is not a record
        lines = complete.splitlines()
        try:
            first = orjson.loads(lines[0]) if lines else None
        except orjson.JSONDecodeError:
            first = None
        if not isinstance(first, dict) or first.get("bi_verify_log") != FORMAT:
            raise SweepLogError(f"{self.path} is not a bi-verify log")
        for key, want in self.header.items():
            if first.get(key) != want:
                raise SweepLogError(
                    f"{self.path} belongs to another sweep ({key} {first.get(key)!r}, here "
                    f"{want!r}); give another path to start anew"
                )
        for n, line in enumerate(lines[1:], start=2):
            try:
                rec = orjson.loads(line)
                self.done[(rec["opset"], int(rec["index"]))] = Check(**rec["check"])
            except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as e:
                raise SweepLogError(f"{self.path} line {n} is not a check: {e}") from None
        if len(complete) != len(data):
            self._file.truncate(len(complete))

    def _write(self, obj: dict) -> None:
        self._file.write(orjson.dumps(obj) + b"\n")
        self._file.flush()

    def record(self, opset: str, index: int, label: str, check: Check) -> None:
        self._write({"opset": opset, "index": index, "label": label, "check": check.as_dict()})

    def close(self) -> None:
        _lock.forget(self._file)
        self._file.close()
