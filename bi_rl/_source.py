"""A digest of the code that ran: every bi_rl Python file and every kernel source file.

Benchmark and verification reports carry it beside the git commit, because a copy of the
tree (a device run, an installed wheel) may have no .git or a stale one; two runs with the
same digest ran the same bi_rl code, whether from a checkout or from the wheel.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from functools import cache
from pathlib import Path


def digest(items: Iterable[tuple[str, bytes]]) -> str:
    """16 hex digits of sha256 over (name, length, bytes) of each item, in the order given."""
    h = hashlib.sha256()
    for name, data in items:
        h.update(f"{name}\0{len(data)}\0".encode())
        h.update(data)
    return h.hexdigest()[:16]


@cache
def source_digest() -> str:
    from bi_rl.backends.base import kernel_files

    pkg = Path(__file__).resolve().parent
    named = [(p.relative_to(pkg).as_posix(), p) for p in pkg.rglob("*.py")]
    named += [("kernels/" + rel, p) for rel, p in kernel_files().items()]
    return digest((rel, path.read_bytes()) for rel, path in sorted(named))
