"""Per-thread mode state: a stack of strict flags, one per `batch_invariant_mode` entered."""

import threading


class _Local(threading.local):
    # A class default: a thread that never entered the mode reads None without the
    # AttributeError path that getattr(..., None) takes on a plain threading.local (every
    # wrapped op asks in_mode(), inside the mode or not).
    stack: list[bool] | None = None


_local = _Local()


def stack() -> list[bool]:
    s = _local.stack
    if s is None:
        s = _local.stack = []
    return s


def in_mode() -> bool:
    """True while this thread is inside batch_invariant_mode."""
    return bool(_local.stack)


def strict() -> bool:
    """Strictness of the innermost mode on this thread; direct calls outside any mode are strict."""
    s = _local.stack
    return s[-1] if s else True
