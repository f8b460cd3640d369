"""Where the code that runs lives, and a digest of it: every bi_rl Python file and kernel file.

Kernel sources (`kernels/` in the repository) ship inside the wheel as `bi_rl/_kernels`;
`kernel_source` and `kernel_files` find them in either place. Benchmark and verification
reports carry `source_digest()` beside the git commit, because a copy of the tree (a device
run, an installed wheel) may have no .git or a stale one; two runs with the same digest ran
the same bi_rl code, whether from a checkout or from the wheel.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from functools import cache
from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent


def _kernel_roots() -> tuple[Path, Path]:
    """Where kernel sources live: the installed wheel's copy, then the repository's."""
    return _PACKAGE / "_kernels", _PACKAGE.parent / "kernels"


def kernel_source(relpath: str) -> str:
    """Text of a kernel source file, from the installed wheel or from the repository."""
    for root in _kernel_roots():
        path = root / relpath
        if path.is_file():
            return path.read_text()
    raise FileNotFoundError(
        f"kernel source {relpath!r} is missing from bi_rl/_kernels and kernels/"
    )


def kernel_files() -> dict[str, Path]:
    """Every kernel source file (.cu, .cuh) by its path relative to the kernel root, sorted."""
    for root in _kernel_roots():
        if root.is_dir():
            files = (p for p in root.rglob("*") if p.suffix in (".cu", ".cuh"))
            return {p.relative_to(root).as_posix(): p for p in sorted(files)}
    return {}


def digest(items: Iterable[tuple[str, bytes]]) -> str:
    """16 hex digits of sha256 over (name, length, bytes) of each item, in the order given."""
    h = hashlib.sha256()
    for name, data in items:
        h.update(f"{name}\0{len(data)}\0".encode())
        h.update(data)
    return h.hexdigest()[:16]


@cache
def source_digest() -> str:
    named = [(p.relative_to(_PACKAGE).as_posix(), p) for p in _PACKAGE.rglob("*.py")]
    named += [("kernels/" + rel, p) for rel, p in kernel_files().items()]
    return digest((rel, path.read_bytes()) for rel, path in sorted(named))
