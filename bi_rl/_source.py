"""A digest of the code that ran: every bi_rl Python file and every kernel source file.

Benchmark and verification reports carry it beside the git commit, because a copy of the
tree (a device run, an installed wheel) may have no .git or a stale one; two runs with the
same digest ran the same bi_rl code, whether from a checkout or from the wheel.
"""

from __future__ import annotations

import hashlib
from functools import cache
from pathlib import Path


@cache
def source_digest() -> str:
    pkg = Path(__file__).resolve().parent
    named = [(p.relative_to(pkg).as_posix(), p) for p in pkg.rglob("*.py")]
    for root in (pkg / "_kernels", pkg.parent / "kernels"):  # the wheel's copy, or the repo's
        if root.is_dir():
            named += [
                ("kernels/" + p.relative_to(root).as_posix(), p)
                for p in root.rglob("*")
                if p.suffix in (".cu", ".cuh")
            ]
            break
    h = hashlib.sha256()
    for rel, path in sorted(named):
        data = path.read_bytes()
        h.update(f"{rel}\0{len(data)}\0".encode())
        h.update(data)
    return h.hexdigest()[:16]
