"""Checking a command's output file before anything runs or is written.

Every command that writes a file (bi-rollout's log, bi-rescore's --report, bi-verify's --json
and --log, bi-bench's --json) calls `check_output` on it first, so a path that cannot take the
output, or that names a file the command reads or a rollout log, stops the command with a
one-line error before minutes of work are done and before any file changes:

  - a directory, or something other than a regular file, at the path;
  - a missing folder whose nearest existing ancestor is a file or is not writable (missing
    folders are created by `make_parent` when the output is written, as bi-rollout does);
  - an existing file that is not writable;
  - the same file as another the command uses (compared after resolving links, and by inode
    where both exist, so a hard link or `./` spelling is caught too);
  - unless `log_ok`, an existing bi-rl rollout log or a log's sidecar (LOG.run.json): a report
    or benchmark written over a log would destroy the record a user's training rests on.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from bi_rl.rollout.schema import FORMAT, Sidecar

__all__ = ["OutputError", "check_output", "is_rollout_file", "make_parent"]

_SIDECAR_SUFFIX = Sidecar.path("x").name[1:]  # ".run.json"


class OutputError(ValueError):
    """An output path the command must not write; the message is one line naming it."""


def is_rollout_file(path: Path) -> str | None:
    """'a bi-rl rollout log' or 'the sidecar of rollout log X' where `path` is one, else None.
    Reads at most the first 64 KiB of the file."""
    try:
        with open(path, "rb") as f:
            head = f.read(1 << 16)
    except OSError:
        return None
    first = head.split(b"\n", 1)[0]
    if b'"format"' in first and f'"{FORMAT}"'.encode() in first:
        return "a bi-rl rollout log"
    if path.name.endswith(_SIDECAR_SUFFIX):
        log = path.with_name(path.name[: -len(_SIDECAR_SUFFIX)])
        if log.is_file() and is_rollout_file(log) == "a bi-rl rollout log":
            return f"the sidecar of rollout log {str(log)!r}"
    return None


def _same(a: Path, b: Path) -> bool:
    if os.path.realpath(a) == os.path.realpath(b):
        return True
    try:
        return a.exists() and b.exists() and os.path.samefile(a, b)
    except OSError:
        return False


def check_output(
    path: str | os.PathLike,
    flag: str,
    reads: Iterable[tuple[str | os.PathLike, str]] = (),
    log_ok: bool = False,
) -> Path:
    """The output path, after the checks of the module docstring; raises OutputError.
    `flag` names the option in the message ('--report'); `reads` pairs each file the command
    uses with what it is ('the log being rescored'). Reads, never writes."""
    out = Path(path)
    if out.is_dir():
        raise OutputError(f"{flag} {str(path)!r} is a directory; pass a file path")
    if out.exists() and not out.is_file():
        raise OutputError(f"{flag} {str(path)!r} is not a regular file; pass a file path")
    for read, what in reads:
        if _same(out, Path(read)):
            raise OutputError(f"{flag} {str(path)!r} is also {what}; choose another file")
    folder = out.absolute().parent
    while not folder.exists():  # the nearest existing ancestor must take the new folders
        folder = folder.parent
    if not folder.is_dir():
        raise OutputError(
            f"cannot create the output directory for {flag} {str(path)!r}: "
            f"{str(folder)!r} is a file"
        )
    if out.exists():
        if not os.access(out, os.W_OK):
            raise OutputError(f"{flag} {str(path)!r} is not writable")
        kind = None if log_ok else is_rollout_file(out)
        if kind:
            raise OutputError(f"{flag} {str(path)!r} is {kind}; choose another file")
    elif not os.access(folder, os.W_OK | os.X_OK):
        raise OutputError(
            f"output directory {str(folder)!r} of {flag} {str(path)!r} is not writable"
        )
    return out


def make_parent(path: str | os.PathLike) -> None:
    """Create the missing folders above an output that `check_output` passed."""
    Path(path).absolute().parent.mkdir(parents=True, exist_ok=True)


def write_atomic(path: str | os.PathLike, data: bytes) -> None:
    """Replace `path` with `data` so that a reader sees the old bytes or the new ones, never a
    mix: written and synced under a temporary name in the same folder, then renamed."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
