"""Per-thread mode state: a stack of strict flags, one per `batch_invariant_mode` entered."""

import threading

_local = threading.local()


def stack() -> list[bool]:
    s = getattr(_local, "stack", None)
    if s is None:
        s = _local.stack = []
    return s


def in_mode() -> bool:
    """True while this thread is inside batch_invariant_mode."""
    return bool(getattr(_local, "stack", None))


def strict() -> bool:
    """Strictness of the innermost mode on this thread; direct calls outside any mode are strict."""
    s = getattr(_local, "stack", None)
    return s[-1] if s else True
