"""The sliding window a boolean attention mask was built with, kept beside the mask.

bi-rl's KV caches for sliding-window layers (bi_rl.rollout.caches) fold the window into the
boolean mask they build for each forward pass, and mlx-lm hands attention that mask alone.
An attention kernel that is also told the window reads no key before it: a row's search for
its first valid key starts at the window instead of key 0, and split plans count only the
keys a row can see. The window changes no arithmetic (a row's keys, and so its bits, are the
mask's either way), only the work done to find them.

`note(mask, window)` records the window for that very array object; `window_of(mask, tq, tk)`
gives it back for a call whose queries are the last tq of tk keys (the alignment the cache
built the mask for), else None. An entry holds its mask weakly (a prefill's mask can take
hundreds of megabytes of device memory) and goes when the mask does, so a later array that
reuses the id finds nothing; a mask with no entry only lacks the hint, never its meaning.
"""

from __future__ import annotations

import threading
import weakref

import mlx.core as mx

_lock = threading.RLock()  # reentrant: a mask's end may call back while a note holds it
_windows: dict[int, tuple[weakref.ref, int]] = {}


def note(mask, window: int) -> None:
    """Record that `mask` (a boolean mask array; anything else is ignored) hides every key
    more than window - 1 positions before its query."""
    if not isinstance(mask, mx.array) or mask.dtype != mx.bool_ or mask.ndim < 2:
        return
    key = id(mask)

    def gone(ref, key=key):
        with _lock:
            if _windows.get(key, (None,))[0] is ref:
                del _windows[key]

    with _lock:
        _windows[key] = (weakref.ref(mask, gone), int(window))


def window_of(mask, tq: int, tk: int) -> int | None:
    """The window noted for this mask object, where its last two axes are (tq, tk); None for
    any other mask."""
    entry = _windows.get(id(mask))
    if entry is None or entry[0]() is not mask or tuple(mask.shape[-2:]) != (tq, tk):
        return None
    return entry[1]


def noted() -> int:
    """How many masks have an entry (tests)."""
    return len(_windows)


def forget() -> None:
    """Drop every entry (tests)."""
    with _lock:
        _windows.clear()
