"""Compile CUDA kernels for this GPU's own architecture with NVRTC, and cache them on disk.

MLX compiles `mx.fast.cuda_kernel` sources for the plain architecture (sm_90 on Hopper), where
the warpgroup MMA instructions (`wgmma`) do not exist: they need the architecture-specific
target sm_90a. Kernels that use them are compiled here instead, through NVIDIA's Python
bindings of NVRTC (the `cuda-bindings` package; NVRTC itself ships with the CUDA runtime
wheels), and launched with `mx.fast.precompiled_cuda_kernel`.

A cubin is cached under `cache_dir()` by a digest of everything that determines it: the source
text, the target, the options and the NVRTC version. The same source never compiles twice on a
machine, and an edited source or a new compiler is a new entry, so a stale cubin can never run.
Entries are written atomically (a partial file never becomes visible) and checked on reading.
"""

from __future__ import annotations

import hashlib
import os
import re
import sys
import threading
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from bi_rl.backends.cuda._files import write_atomic

CACHE_ENV = "BI_RL_CUDA_CACHE"
OPTIONS = ("--std=c++17", "-Xptxas=-v")
_ELF = b"\x7fELF"
_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")


class CompileError(RuntimeError):
    """NVRTC refused a kernel source; the message holds its log."""


@dataclass(frozen=True)
class Compiled:
    cubin: bytes
    log: str  # ptxas' resource report: registers, shared memory, spills
    path: Path | None  # the cache entry, None where the cache could not be written
    symbols: tuple[tuple[str, str], ...] = ()  # (C++ name, symbol in the cubin) asked for

    def symbol(self, name: str) -> str:
        return dict(self.symbols)[name]

    @property
    def spills(self) -> bool:
        """Whether ptxas reports a stack frame or spill traffic (both slow a kernel badly)."""
        return any(int(n) for m in _FRAME.finditer(self.log) for n in m.groups())

    @property
    def registers(self) -> int:
        """Registers per thread of the kernel (the largest function in the report)."""
        regs = [
            int(ln.split("Used ")[1].split(" registers")[0])
            for ln in self.log.splitlines()
            if "Used " in ln and " registers" in ln
        ]
        return max(regs, default=0)


def cache_dir() -> Path:
    """$BI_RL_CUDA_CACHE, else $XDG_CACHE_HOME/bi_rl/cuda, else ~/.cache/bi_rl/cuda."""
    env = os.environ.get(CACHE_ENV)
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg) if xdg else Path.home() / ".cache"
    return base / "bi_rl" / "cuda"


@cache
def nvrtc_module():
    """cuda.bindings.nvrtc, or None where NVIDIA's Python bindings are not installed."""
    try:
        from cuda.bindings import nvrtc
    except ImportError:
        return None
    return nvrtc


@cache
def nvrtc_version() -> str:
    nvrtc = nvrtc_module()
    if nvrtc is None:
        raise CompileError("NVRTC is not available: pip install cuda-bindings")
    _, major, minor = nvrtc.nvrtcVersion()
    return f"{major}.{minor}"


def _check(result, what: str, log: str = "") -> None:
    code = result[0] if isinstance(result, tuple) else result
    if int(code) != 0:
        raise CompileError(f"{what} failed ({code}){': ' + log if log else ''}")


@contextmanager
def _program(source: str, name: str, arch: str, headers: dict[str, str], names=()):
    """An NVRTC program of `source` compiled for `arch` (an sm_ architecture: a cubin; a
    compute_ one: PTX), with the C++ names `names` registered for lowering: yields (nvrtc,
    program, log) and destroys the program afterwards. CompileError where it does not build."""
    nvrtc = nvrtc_module()
    if nvrtc is None:
        raise CompileError("NVRTC is not available: pip install cuda-bindings")
    err, prog = nvrtc.nvrtcCreateProgram(
        source.encode(),
        f"{name}.cu".encode(),
        len(headers),
        [h.encode() for h in headers.values()],
        [n.encode() for n in headers],
    )
    _check(err, "nvrtcCreateProgram")
    try:
        for expr in names:
            _check(nvrtc.nvrtcAddNameExpression(prog, expr.encode()), "nvrtcAddNameExpression")
        opts = [f"--gpu-architecture={arch}".encode(), *(o.encode() for o in OPTIONS)]
        result = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
        _, size = nvrtc.nvrtcGetProgramLogSize(prog)
        buf = b" " * size
        nvrtc.nvrtcGetProgramLog(prog, buf)
        log = buf.rstrip(b"\x00 ").decode(errors="replace")
        _check(result, f"compiling {name} for {arch}", log)
        yield nvrtc, prog, log
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


def _nvrtc_compile(
    source: str, name: str, arch: str, headers: dict[str, str], names: tuple[str, ...]
) -> tuple[bytes, str, tuple[tuple[str, str], ...]]:
    with _program(source, name, arch, headers, names) as (nvrtc, prog, log):
        _, size = nvrtc.nvrtcGetCUBINSize(prog)
        cubin = b" " * size
        _check(nvrtc.nvrtcGetCUBIN(prog, cubin), "nvrtcGetCUBIN")
        symbols = []
        for expr in names:
            err, lowered = nvrtc.nvrtcGetLoweredName(prog, expr.encode())
            _check(err, f"nvrtcGetLoweredName({expr})")
            symbols.append((expr, lowered.decode()))
        return bytes(cubin), log, tuple(symbols)


def compile_ptx(
    source: str, name: str, arch: str = "compute_90a", headers: dict[str, str] | None = None
) -> str:
    """The PTX NVRTC makes of `source` for a virtual architecture (the front end only: no
    ptxas, not cached). Identical PTX is identical input to ptxas, which is how a kernel
    refactor is shown to change no instruction (tools/hopper_ptx.py)."""
    with _program(source, name, arch, headers or {}) as (nvrtc, prog, _):
        _, size = nvrtc.nvrtcGetPTXSize(prog)
        ptx = b" " * size
        _check(nvrtc.nvrtcGetPTX(prog, ptx), "nvrtcGetPTX")
        return ptx.rstrip(b"\x00 ").decode()


def key(source: str, arch: str, headers: dict[str, str], names: tuple[str, ...]) -> str:
    h = hashlib.sha256()
    for part in (nvrtc_version(), arch, *OPTIONS, source, *names, *headers, *headers.values()):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()[:32]


_LOCK = threading.Lock()
_MEMO: dict[tuple[str, str], Compiled] = {}
# Where set, called with a compile's label instead of compile_cubin's one-line notice (a caller
# that compiles a known set of kernels counts them itself: bi_rl.model.kernels).
on_compile: Callable[[str], None] | None = None


def compile_cubin(
    source: str,
    name: str,
    arch: str = "sm_90a",
    *,
    headers: dict[str, str] | None = None,
    names: tuple[str, ...] = (),
    label: str = "",
) -> Compiled:
    """The cubin of `source` for `arch`: from memory, from the disk cache, or compiled now.

    headers: included files by name, supplied in memory; names: C++ names of kernels whose
    symbols (mangled names) the result reports. A compile prints one line to stderr (it takes a
    second or more; it happens once per kernel configuration and machine), or calls
    `on_compile` where set. `label` names the kernel in that line.
    """
    headers = headers or {}
    memo_key = (source, arch, names)
    hit = _MEMO.get(memo_key)
    if hit is not None:
        return hit
    with _LOCK:
        hit = _MEMO.get(memo_key)
        if hit is not None:
            return hit
        digest = key(source, arch, headers, names)
        path = cache_dir() / f"{name}-{arch}-{digest}.cubin"
        compiled = _read(path, names)
        if compiled is None:
            if on_compile is not None:
                on_compile(label or name)
            else:
                print(
                    f"bi_rl: compiling CUDA kernel {label or name} for {arch} (first use on "
                    f"this machine; cached in {path.parent}; `bi-verify --warmup --model DIR` "
                    "compiles a model's kernels ahead)",
                    file=sys.stderr,
                    flush=True,
                )
            cubin, log, symbols = _nvrtc_compile(source, name, arch, headers, names)
            compiled = Compiled(cubin, log, _write(path, cubin, log, symbols), symbols)
        _MEMO[memo_key] = compiled
        return compiled


def _read(path: Path, names: tuple[str, ...]) -> Compiled | None:
    try:
        cubin = path.read_bytes()
        log = path.with_suffix(".log").read_text()
        lines = path.with_suffix(".sym").read_text().splitlines()
    except (OSError, UnicodeDecodeError):
        return None
    symbols = tuple(tuple(ln.split("\t", 1)) for ln in lines if "\t" in ln)
    if not cubin.startswith(_ELF) or tuple(n for n, _ in symbols) != names:
        return None
    return Compiled(cubin, log, path, symbols)


def _write(path: Path, cubin: bytes, log: str, symbols) -> Path | None:
    """Writes the log and symbols, then the cubin, each atomically; None if the cache is not
    writable (the cubin last: an entry whose cubin exists is complete)."""
    sym = "".join(f"{n}\t{s}\n" for n, s in symbols)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        parts = ((path.with_suffix(".log"), log.encode()), (path.with_suffix(".sym"), sym.encode()))
        for target, data in (*parts, (path, cubin)):
            write_atomic(target, data)
    except OSError:
        return None
    return path
