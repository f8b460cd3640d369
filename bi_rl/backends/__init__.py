"""The backend layer: which backend serves the current thread, and what each one promises.

One module per backend (`cpu`, `cuda`, `metal`) builds a `Backend` whose `ops` table holds
its invariant implementations. `active()` picks the backend from MLX's default device; tests
and tools can substitute another with `use(backend)`, which is per thread.
"""

from __future__ import annotations

import importlib
import threading
from contextlib import contextmanager
from functools import cache

import mlx.core as mx

from bi_rl._source import kernel_source
from bi_rl.backends.base import OPS, Backend, Unsupported

__all__ = ["OPS", "Backend", "Unsupported", "active", "device_name", "get", "kernel_source", "use"]

_MODULES = {
    "cpu": "bi_rl.backends.cpu",
    "cuda": "bi_rl.backends.cuda",
    "metal": "bi_rl.backends.metal",
}


class _Local(threading.local):
    override: Backend | None = None  # a class default: no AttributeError path per lookup


_local = _Local()


@cache
def get(name: str) -> Backend:
    """The backend called `name` ("cpu", "cuda" or "metal")."""
    if name not in _MODULES:
        raise ValueError(f"unknown backend {name!r}; expected one of {', '.join(_MODULES)}")
    return importlib.import_module(_MODULES[name]).BACKEND


@cache
def _gpu_name() -> str:
    return "cuda" if mx.cuda.is_available() else "metal"


_GPU = mx.DeviceType.gpu  # nanobind enum members are singletons: `is` compares them cheaply


def default_name() -> str:
    """The backend MLX's default device runs on."""
    return _gpu_name() if mx.default_device().type is _GPU else "cpu"


def device_name() -> str:
    """The default device's name as MLX reports it ("NVIDIA H200", "AMD EPYC", ...)."""
    try:
        info = mx.device_info()
    except Exception:
        info = {}
    return str(info.get("device_name") or info.get("architecture") or mx.default_device())


def active() -> Backend:
    """The backend serving this thread: a `use()` override, else the default device's."""
    override = _local.override
    return override if override is not None else get(default_name())


@contextmanager
def use(backend: Backend):
    """Serve this thread's invariant ops from `backend` (tests, tools) until the block ends."""
    previous = _local.override
    _local.override = backend
    try:
        yield backend
    finally:
        _local.override = previous
