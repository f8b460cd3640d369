"""Logits -> float32 logprobs and row fingerprints: the one step sampler and scorer share.

Two functions define what a token's probability *is* in bi-rl, and both the rollout
engine and the scorer call them, so a logprob logged at sampling time and one recomputed
later are the same arithmetic on the same logits:

- `token_logprobs(logits, tokens, temperature)`: log_softmax(logits.astype(float32) / T)
  at the given tokens, float32. T is the sampling temperature, or 1 for greedy (T = 0).
  The scaling divides by float32(T); log_softmax is `x - logsumexp(x)` over the last axis.
  The logprob is of the full, unfiltered distribution: top-k / top-p / min-p change which
  tokens can be drawn, not the probability recorded for the drawn one.

- `row_fingerprints(logits)`: an exact digest of each full logit row, computed on the
  device from the raw bit patterns of the logits in the model's dtype. Each element
  contributes h(v, bits(logit_v)), an integer hash of its index and bits; the row digest is
  the wrapping uint32 sum of those contributions, in two independent lanes (64 bits in
  all). Integer addition modulo 2^32 is commutative and associative, so the digest cannot
  depend on the order a reduction visits the row: any backend, any kernel, any batch gives
  the same integer for the same bits, and any single-bit change of any logit changes it.

Invariant kept: row i's logprobs and fingerprint depend only on row i's logits (each is a
row-local op: an elementwise map, a last-axis logsumexp, a last-axis integer sum).

The integer hash is murmur3's 32-bit finaliser (`fmix32`); `fmix32_np` is the same function
in NumPy for host-side reimplementation and tests. MLX's uint32 multiply, add and shifts
wrap modulo 2^32 as in C (checked in tests/test_logprobs.py).
"""

from __future__ import annotations

import math

import mlx.core as mx
import numpy as np

from bi_rl import _stock

__all__ = [
    "FINGERPRINT_LANES",
    "check_temperature",
    "fingerprint_index_hash",
    "fingerprint_ints",
    "fmix32",
    "fmix32_np",
    "logit_bits",
    "logprobs_from_bits",
    "logprob_temperature",
    "row_fingerprints",
    "row_fingerprints_np",
    "scaled_logits",
    "scaled_token_logprobs",
    "token_logprobs",
]

# Per lane: (multiplier for the index, offset for the index). Two lanes -> a 64-bit digest.
FINGERPRINT_LANES = ((0x9E3779B1, 0x7F4A7C15), (0x85EBCA77, 0x165667B1))

_M1 = 0x85EBCA6B
_M2 = 0xC2B2AE35


def fmix32(x: mx.array) -> mx.array:
    """murmur3's 32-bit finaliser on a uint32 array: a bijection with full avalanche."""
    x = x ^ (x >> 16)
    x = x * mx.array(_M1, dtype=mx.uint32)
    x = x ^ (x >> 13)
    x = x * mx.array(_M2, dtype=mx.uint32)
    return x ^ (x >> 16)


def fmix32_np(x: np.ndarray) -> np.ndarray:
    """`fmix32` in NumPy (uint32 in, uint32 out), for host-side checks."""
    x = np.asarray(x, dtype=np.uint32)
    with np.errstate(over="ignore"):
        x = x ^ (x >> np.uint32(16))
        x = x * np.uint32(_M1)
        x = x ^ (x >> np.uint32(13))
        x = x * np.uint32(_M2)
        return x ^ (x >> np.uint32(16))


def check_temperature(temperature: float) -> None:
    """Raise ValueError unless temperature is a finite number >= 0 (0 means greedy)."""
    if not (temperature >= 0 and math.isfinite(temperature)):
        raise ValueError(f"temperature must be a finite number >= 0, got {temperature}")


def logprob_temperature(temperature: float) -> float:
    """The temperature logprobs are taken at: T itself, or 1 for greedy decoding (T = 0)."""
    check_temperature(temperature)
    return 1.0 if temperature == 0 else float(temperature)


def scaled_logits(logits: mx.array, temperature: float) -> mx.array:
    """logits.astype(float32) / float32(T) (T = 1 for greedy): what sampling and logprobs see."""
    t = logprob_temperature(temperature)
    return logits.astype(mx.float32) / mx.array(t, dtype=mx.float32)


def token_logprobs(logits: mx.array, tokens: mx.array, temperature: float = 1.0) -> mx.array:
    """float32 log_softmax(logits / T) at `tokens`.

    logits: (..., V) in any float dtype; tokens: (...) integer ids. Returns (...) float32.
    """
    return scaled_token_logprobs(scaled_logits(logits, temperature), tokens)


def scaled_token_logprobs(x: mx.array, tokens: mx.array) -> mx.array:
    """`token_logprobs` of logits already scaled by `scaled_logits`: the same ops after it, so
    a caller that holds x (the engine, which samples from it too) need not cast and divide
    the logits a second time."""
    lse = mx.logsumexp(x, axis=-1)
    picked = mx.take_along_axis(x, tokens.astype(mx.int32)[..., None], axis=-1)[..., 0]
    return picked - lse


def logit_bits(logits: mx.array) -> mx.array:
    """The raw bit pattern of each logit as uint32 (16-bit floats zero-extended)."""
    if logits.dtype == mx.float32:
        return logits.view(mx.uint32)
    if logits.dtype in (mx.float16, mx.bfloat16):
        return logits.view(mx.uint16).astype(mx.uint32)
    raise TypeError(f"cannot fingerprint logits of dtype {logits.dtype}")


_index_hashes: dict[int, mx.array] = {}


def _index_hash(vocab: int) -> mx.array:
    """(lanes, V) uint32: fmix32(v * a + b) per lane; a pure function of V, memoised."""
    h = _index_hashes.get(vocab)
    if h is None:
        h = mx.array(_index_hash_np(vocab))
        _index_hashes[vocab] = h
    return h


def fingerprint_index_hash(vocab: int) -> mx.array:
    """(lanes, V) uint32: each lane's fmix32(v * a + b), the per-index term of
    `row_fingerprints` (for kernels that compute the fingerprint themselves)."""
    return _index_hash(vocab)


def _index_hash_np(vocab: int) -> np.ndarray:
    v = np.arange(vocab, dtype=np.uint64)
    rows = [((v * a + b) & 0xFFFFFFFF).astype(np.uint32) for a, b in FINGERPRINT_LANES]
    return fmix32_np(np.stack(rows))


def row_fingerprints(logits: mx.array) -> mx.array:
    """(..., V) logits -> (..., 2) uint32: per lane, sum_v fmix32(bits_v ^ fmix32(v*a + b)).

    The sum wraps modulo 2^32 (MLX keeps uint32 sums in uint32), so it is exact and
    independent of reduction order. `fingerprint_ints` packs the two lanes into one int.
    """
    return _fingerprint_lanes(logit_bits(logits), _index_hash(logits.shape[-1]))


def _lanes(bits: mx.array, idx: mx.array) -> mx.array:
    lanes = [mx.sum(fmix32(bits ^ idx[i]), axis=-1) for i in range(len(FINGERPRINT_LANES))]
    return mx.stack(lanes, axis=-1)


# Compiled, so the dozen element-wise integer ops per lane fuse into one pass over the row
# (uncompiled, each materialises a B x V temporary: measured 2.6-7.2% of rollout time on the
# H200 at vocab 151936). Integer arithmetic wraps identically fused or not, so the digest is
# the same bits either way (tests compare it with the NumPy reference).
_fingerprint_lanes = _stock.compile(_lanes)


def row_fingerprints_np(bits: np.ndarray) -> np.ndarray:
    """NumPy reference of `row_fingerprints` from uint32 bit patterns (..., V) -> (..., 2)."""
    bits = np.asarray(bits, dtype=np.uint32)
    idx = _index_hash_np(bits.shape[-1])
    lanes = [
        (fmix32_np(bits ^ idx[i]).astype(np.uint64).sum(axis=-1) & 0xFFFFFFFF).astype(np.uint32)
        for i in range(len(FINGERPRINT_LANES))
    ]
    return np.stack(lanes, axis=-1)


def logprobs_from_bits(bits) -> np.ndarray:
    """float32 logprobs from their uint32 bit patterns (a log's logprob_bits), bit-exact."""
    return np.asarray(bits, dtype=np.uint32).view(np.float32)


def fingerprint_ints(fps) -> list[int]:
    """(N, 2) uint32 lanes (mx or NumPy) -> N Python ints, lane 1 in the high 32 bits."""
    a = np.asarray(fps, dtype=np.uint64).reshape(-1, 2)
    return ((a[:, 1] << np.uint64(32)) | a[:, 0]).tolist()
