"""One writer per file: advisory locks for the append-only logs (rollout logs, sweep logs).

A writer takes an exclusive lock (`flock`) on the file it writes, held for as long as it has
the file open; the lock belongs to the file, not its name, so a new log written aside keeps
its lock when it is renamed into place. Another process that would write the same log (a
second `--resume`, an `--overwrite` of a log being written) asks first, with `held_elsewhere`,
and is refused; a reader that meets a half-written last line can say that a run is still
writing it instead of calling it a killed run. A resumer takes the lock before it reads
and trims the log, so two resumers can never both cut the same torn line or append after it.

Locks are advisory (they bind bi-rl's own writers, not other programs) and exist where the
platform has `fcntl.flock` (Linux, macOS) and the filesystem honours it; elsewhere (another
platform, a mount without locks) every call here succeeds and nothing is locked, as before
locks existed. A process's own locks are not "elsewhere": a writer checking its own log passes.
"""

from __future__ import annotations

import os

try:
    import fcntl
except ImportError:  # no flock on this platform: no locking
    fcntl = None

__all__ = ["forget", "held_elsewhere", "take"]

_OURS: set[tuple[int, int]] = set()  # (device, inode) of the files this process has locked


def take(f) -> bool:
    """Lock the open file `f` for writing without waiting; False where another holder has it.
    The lock goes when `f` is closed (call `forget(f)` before closing)."""
    if fcntl is None:
        return True
    try:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    except OSError:  # a filesystem without locks (some network mounts): write unlocked
        return True
    st = os.fstat(f.fileno())
    _OURS.add((st.st_dev, st.st_ino))
    return True


def forget(f) -> None:
    """`f`'s lock is about to go with its closing: it is no longer this process's."""
    if fcntl is None or f.closed:
        return
    st = os.fstat(f.fileno())
    _OURS.discard((st.st_dev, st.st_ino))


def held_elsewhere(path) -> bool:
    """Whether another process holds the write lock on the file at `path`; False for a
    missing or unreadable file."""
    if fcntl is None:
        return False
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return False
    try:
        st = os.fstat(fd)
        if (st.st_dev, st.st_ino) in _OURS:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        except OSError:  # no locks on this filesystem: nobody can hold one
            return False
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    finally:
        os.close(fd)
