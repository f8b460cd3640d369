"""Shared test helpers: bit views, random inputs and a backend that marks what it computed."""

from __future__ import annotations

import collections
import importlib.util
import sys
from contextlib import contextmanager
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest

from bi_rl import _stock, backends
from bi_rl.backends import Backend
from bi_rl.verify import attention as verify_attention
from bi_rl.verify import core as verify_core

ROOT = Path(__file__).resolve().parent.parent


def load_script(relpath: str):
    """Import a script of examples/ or tools/ (folders that are not packages) by its path."""
    path = ROOT / relpath
    spec = importlib.util.spec_from_file_location(path.stem, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up while it loads
    spec.loader.exec_module(mod)
    return mod


def ensure_qwen2_05b(model_dir) -> None:
    """Write the random-weight 0.5B-shaped Qwen2 (tools/make_qwen2_05b.py) where a golden
    H200 log's header says it lives, if it is not there yet."""
    import shutil
    import subprocess
    import tempfile

    model_dir = Path(model_dir)
    if model_dir.exists():
        return
    # Test workers run side by side (pytest -n) and two of them may need the model at once:
    # each writes it under a private name and renames the whole folder into place, so no
    # worker ever loads a half-written model. The loser of the rename drops its copy.
    home = model_dir.parent
    home.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{home.name}-", dir=home.parent))
    try:
        script = ROOT / "tools" / "make_qwen2_05b.py"
        subprocess.run([sys.executable, str(script), str(tmp)], check=True)
        tmp.chmod(0o755)  # mkdtemp makes it private; the model folder is an ordinary one
        try:
            tmp.rename(home)
        except OSError:
            if not model_dir.exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


cuda_only = pytest.mark.skipif(not mx.cuda.is_available(), reason="needs MLX's CUDA backend")
stock_is_invariant = pytest.mark.skipif(
    mx.default_device().type != mx.DeviceType.cpu,
    reason="stock MLX computes each row alone on the CPU backend only",
)


bits = verify_core.bits  # the raw bit pattern: uint32 for float32, uint16 for half types


def differing(a: mx.array, b: mx.array) -> int:
    """How many elements of a and b differ in their bit patterns (shapes must match)."""
    ba, bb = bits(a), bits(b)
    assert ba.shape == bb.shape, (ba.shape, bb.shape)
    return int((ba != bb).sum())


def assert_same_bits(got: mx.array, want: mx.array, what: str) -> None:
    """Invariance: every element of got has want's bit pattern (shapes must match)."""
    bad = differing(got, want)
    assert bad == 0, f"{what}: {bad} of {want.size} outputs differ"


def record_masks(monkeypatch) -> list[tuple[bool, bool, str]]:
    """Spy on the engine's batch caches' masks: every EngineBatchKVCache.make_mask call (its
    subclasses' too) appends (the cache's padded flag, several queries, what it returned:
    "none", "causal" or "array") to the list returned."""
    from bi_rl.rollout.caches import EngineBatchKVCache

    real, seen = EngineBatchKVCache.make_mask, []

    def make_mask(self, N, *args, **kwargs):
        m = real(self, N, *args, **kwargs)
        kind = "none" if m is None else m if isinstance(m, str) else "array"
        seen.append((self.padded, N > 1, kind))
        return m

    monkeypatch.setattr(EngineBatchKVCache, "make_mask", make_mask)
    return seen


def assert_same_unmasked_samples(dropped: list, kept: list, mode: str) -> None:
    """Samples with the attention mask dropped where no row is padded against the
    always-masked control. In strict mode: the same tokens and logprob bits on every device
    (the invariant attention reduces the same keys in the same order whatever the mask's form).
    In mode off: the same on the CPU, where stock attention is one reduction with a mask or
    without; on CUDA the same samples (units and counts) only, since there the unmasked step
    runs stock's one-query kernel and the masked one its unfused path, whose rounding differs
    enough to flip a sampled token (seen on an H100, float32). That both compute the same
    attention is test_caches' accuracy test against float64."""
    same_bits = mode != "off" or mx.default_device() == mx.cpu
    assert [a.unit for a in dropped] == [b.unit for b in kept]
    if not same_bits:
        return
    for a, b in zip(dropped, kept, strict=True):
        assert a.tokens == b.tokens, f"sample {a.unit}: tokens differ"
        assert a.logprob_bits == b.logprob_bits, f"sample {a.unit}: logprob bits differ"


f64 = verify_core.f64  # float64 copies for references
relerr = verify_core.relerr  # accuracy against a float64 reference


def attention_reference(q, k, v, scale, mask=None, sinks=None, *, window=None, key_start=None):
    """float64 attention from the definition, with MLX's semantics: logical key j of batch row
    b is stored at (key_start[b] + j) % Tk; query i sits at position p = i + Tk - Tq and sees
    keys p - window < j <= p (with a window) that the mask allows ("causal": j <= p; bool,
    over logical keys; additive); a sink is one more logit in each row's softmax; masked keys
    are excluded exactly."""
    qf, kf, vf = f64(q), f64(k), f64(v)
    b, hq, tq, _ = qf.shape
    tk = kf.shape[2]
    if key_start is not None:
        ks = np.array(key_start).astype(np.int64)
        idx = (ks[:, None] + np.arange(tk)[None, :]) % tk
        kf = np.stack([kf[i][:, idx[i]] for i in range(b)])
        vf = np.stack([vf[i][:, idx[i]] for i in range(b)])
    r = hq // kf.shape[1]
    kf, vf = np.repeat(kf, r, axis=1), np.repeat(vf, r, axis=1)
    s = np.einsum("bhqd,bhkd->bhqk", qf, kf) * scale
    pos = np.arange(tq)[:, None] + tk - tq
    j = np.arange(tk)[None, :]
    ok = np.ones(s.shape, bool)
    if window is not None:
        ok &= (j <= pos) & (j > pos - window)
    if isinstance(mask, str):
        ok &= j <= pos
    elif mask is not None and mask.dtype == mx.bool_:
        ok &= np.broadcast_to(np.array(mask), s.shape)
    elif mask is not None:
        s = s + f64(mask)
    s = np.where(ok, s, -np.inf)
    if sinks is not None:
        sk = np.broadcast_to(f64(sinks)[None, :, None, None], s.shape[:3] + (1,))
        s = np.concatenate([sk, s], axis=-1)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    if sinks is not None:
        p = p[..., 1:]
    return np.einsum("bhqk,bhkd->bhqd", p, vf)


@contextmanager
def cpu_default():
    """The CPU as MLX's default device for the block (and so the CPU backend serving the mode,
    whose GEMM is stock MLX's), the previous default restored after it, also on a failure."""
    previous = mx.default_device()
    mx.set_default_device(mx.cpu)
    try:
        yield
    finally:
        mx.set_default_device(previous)


def rand(shape, dtype=mx.float32, key=0, scale=1.0):
    return verify_core.rand(shape, dtype, key, scale)


MARK = 1000.0


def counting_backend(backend: Backend | None = None):
    """`backend` (the active one by default) with every op call counted by name: a spy that
    proves which ops a forward reached, computing what the backend computes."""
    backend = backend or backends.active()
    calls = collections.Counter()

    def wrap(name, fn):
        def impl(*args, **kwargs):
            calls[name] += 1
            return fn(*args, **kwargs)

        return impl

    return Backend(backend.name, {k: wrap(k, f) for k, f in backend.ops.items()}), calls


def marking_backend(name: str = "marking"):
    """A backend whose ops add MARK to the stock result and count their calls.

    It proves which path ran: a result carrying the mark came through the mode.
    """
    calls = collections.Counter()

    def op(name_, fn):
        def impl(*args):
            calls[name_] += 1
            return fn(*args) + MARK

        return impl

    def qmm(x, w, scales, biases=None, transpose=True, group_size=None, bits=None, mode="affine"):
        return _stock.quantized_matmul(x, w, scales, biases, transpose, group_size, bits, mode)

    def gmm(a, b, lhs_indices=None, rhs_indices=None, sorted_indices=False):
        return _stock.gather_mm(a, b, lhs_indices, rhs_indices, sorted_indices=sorted_indices)

    def gqmm(x, w, scales, biases, lhs, rhs, transpose, group_size, bits, mode, gscale, sort):
        args = (x, w, scales, biases, lhs, rhs, transpose, group_size, bits, mode)
        return _stock.gather_qmm(*args, sorted_indices=sort)

    backend = Backend(
        name=name,
        ops={
            "linear": op("linear", _stock.linear),
            "matmul": op("matmul", _stock.matmul),
            "addmm": op("addmm", _stock.addmm),
            "quantized_matmul": op("quantized_matmul", qmm),
            "scaled_dot_product_attention": op("scaled_dot_product_attention", _stock.sdpa),
            "batched_matmul": op("batched_matmul", _stock.matmul),
            "gather_mm": op("gather_mm", gmm),
            "gather_qmm": op("gather_qmm", gqmm),
        },
    )
    return backend, calls


ring_of = verify_attention.ring_layout  # a rotating cache's storage of the last keys


HOLD = """
import sys
from bi_rl import _lock
f = open(sys.argv[1], "ab")
assert _lock.take(f)
print("held", flush=True)
sys.stdin.read()
"""


@pytest.fixture
def held():
    """hold(path): another process takes the log's write lock (bi_rl._lock) and keeps it
    until the test ends or the test closes that process's stdin; returns the process."""
    import subprocess

    procs = []

    def hold(path):
        p = subprocess.Popen(
            [sys.executable, "-c", HOLD, str(path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE
        )
        procs.append(p)
        assert p.stdout.readline() == b"held\n"
        return p

    yield hold
    for p in procs:
        if not p.stdin.closed:
            p.stdin.close()
        p.wait(timeout=30)
