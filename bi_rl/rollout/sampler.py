"""Keyed sampler: a row's token is a pure function of its logits, its key and the settings.

No global random state. The noise added to token v of sequence s at completion position t
is a counter-based hash of (seed, s, t, v), computed with uint32 ops on the device:

  sequence id   s = blake2b-64(prompt id, sample index)        (`sequence_id`, host)
  row key  (k0, k1) = blake2b-64(seed, s, t) as two uint32 words (`row_key`, host)
  x = fmix32(fmix32(fmix32(v * 0x9E3779B9 + k0) ^ k1) + k0)    (device, per element)
  u = (2 * (x >> 9) + 1) / 2^24        an odd multiple of 2^-24: exact in float32 and
                                       strictly inside (0, 1), never 0 or 1
  g = -log(-log(u))                    standard Gumbel noise

and the token is the first argmax of logits/T + g over the tokens the filters keep
(Gumbel-max: a draw from softmax(logits/T) restricted to the kept set). The sequence id comes
from the prompt's id and the sample index, never from a batch position, so a row's token is
the same alone, in a batch of 64, in any order, on any shard.

Settings (`SamplerConfig`), each a per-row operation on float32 logits / T:
  temperature 0  greedy: the first argmax of the logits (lowest token id among ties).
  top_k > 0      keep tokens whose value is >= the k-th largest value (ties at the k-th
                 value are all kept, so no tie-break is needed).
  top_p < 1      on the top-k-filtered distribution, keep the smallest set of most probable
                 tokens whose mass reaches top_p: sorted descending, a token is kept when
                 the mass strictly above it (an exclusive cumulative sum) is < top_p; every
                 token as probable as the least probable kept one is kept too.
  min_p > 0      keep tokens with p >= min_p * p_max, computed as x - max(x) >= log(min_p).
The most probable token always survives every filter.

Invariant kept: row i's token depends only on row i's logits and key (sorts, cumulative
sums and reductions run along the vocabulary axis of that row alone).
"""

from __future__ import annotations

import hashlib
import math
import os
import struct
from dataclasses import dataclass
from functools import lru_cache

import mlx.core as mx
import numpy as np

from bi_rl import _stock
from bi_rl.logprobs import (
    check_temperature,
    fingerprint_index_hash,
    fmix32,
    row_fingerprints,
    scaled_logits,
)

__all__ = [
    "FUSED_ENV",
    "SamplerConfig",
    "bits_to_uniform",
    "draw",
    "filter_mask",
    "fingerprints",
    "first_argmax",
    "gumbel_noise",
    "row_key",
    "row_keys",
    "sample",
    "sample_scaled",
    "sequence_id",
    "uniform_noise",
]

DEFAULT_TEMPERATURE = 1.0
DEFAULT_TOP_P = 1.0
DEFAULT_TOP_K = 0
DEFAULT_MIN_P = 0.0
DEFAULT_SEED = 0

_GOLDEN = 0x9E3779B9
_U64 = 1 << 64


@dataclass(frozen=True)
class SamplerConfig:
    """How tokens are drawn. `temperature=0` is greedy; the filters are off at their defaults.

    seed is the run's sampling seed, 0 <= seed < 2^64: with the prompt id, the sample index
    and the position it keys every random draw (`row_key`).
    """

    temperature: float = DEFAULT_TEMPERATURE
    top_p: float = DEFAULT_TOP_P
    top_k: int = DEFAULT_TOP_K
    min_p: float = DEFAULT_MIN_P
    seed: int = DEFAULT_SEED

    def __post_init__(self):
        check_temperature(self.temperature)
        if not (isinstance(self.seed, int) and 0 <= self.seed < _U64):
            raise ValueError(f"seed must be an integer in [0, 2^64), got {self.seed!r}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 = off), got {self.top_k}")
        if not 0 <= self.min_p < 1:
            raise ValueError(f"min_p must be in [0, 1), got {self.min_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def sequence_id(prompt_id: str, sample_index: int) -> int:
    """A 64-bit id for sample `sample_index` of the prompt called `prompt_id`."""
    data = prompt_id.encode("utf-8") + b"\x00" + struct.pack("<Q", sample_index)
    return int.from_bytes(
        hashlib.blake2b(data, digest_size=8, person=b"bi-rl/seq").digest(), "little"
    )


def row_key(seed: int, seq_id: int, position: int) -> tuple[int, int]:
    """(k0, k1): the two uint32 key words for one row at one completion position."""
    d = _key_digest(seed, seq_id, position)
    return int.from_bytes(d[:4], "little"), int.from_bytes(d[4:], "little")


def row_keys(seed: int, rows) -> mx.array:
    """(B, 2) uint32 keys for rows given as (sequence id, position) pairs: `row_key` of each
    row, the digests read as one little-endian uint32 array."""
    digests = b"".join(_key_digest(seed, s, t) for s, t in rows)
    words = np.frombuffer(digests, dtype="<u4").astype(np.uint32)
    return mx.array(words.reshape(-1, 2))


def _key_digest(seed: int, seq_id: int, position: int) -> bytes:
    """blake2b-64, personalised b"bi-rl/key", of (seed, seq_id, position) packed as three
    little-endian uint64. The engine needs one for every row at every decode step, on the
    host, so the hash starts from a state already fed (seed, seq_id) (the same bytes in the
    same order, so the same digest)."""
    if not (0 <= position < _U64):
        raise ValueError("seed, sequence id and position must be in [0, 2^64)")
    h = _prefix(seed, seq_id).copy()
    h.update(struct.pack("<Q", position))
    return h.digest()


@lru_cache(maxsize=65536)
def _prefix(seed: int, seq_id: int):
    """blake2b-64 with the key personalisation, fed the first 16 of its 24 bytes."""
    if not (0 <= seed < _U64 and 0 <= seq_id < _U64):
        raise ValueError("seed, sequence id and position must be in [0, 2^64)")
    return hashlib.blake2b(struct.pack("<QQ", seed, seq_id), digest_size=8, person=b"bi-rl/key")


def uniform_noise(keys: mx.array, vocab: int) -> mx.array:
    """(B, 2) uint32 keys -> (B, V) float32 uniforms, odd multiples of 2^-24 in (0, 1)."""
    return _uniform(keys, _index_times_golden(vocab))


def _uniform_reference(keys: mx.array, v: mx.array) -> mx.array:
    k0 = keys[:, 0:1]
    k1 = keys[:, 1:2]
    return bits_to_uniform(fmix32(fmix32(fmix32(v + k0) ^ k1) + k0))


# Compiled, so the two dozen element-wise ops fuse into one pass over the (B, V) noise. Every
# one of them is exact (wrapping uint32 arithmetic, then a uint32 below 2^24 to float32 and a
# multiply by a power of two), so fused or not they give the same bits; the inexact steps
# after it (the logs of the Gumbel transform) stay separate ops.
_uniform = _stock.compile(_uniform_reference)

_index_cache: dict[int, mx.array] = {}


def _index_times_golden(vocab: int) -> mx.array:
    """(1, V) uint32 v * 0x9E3779B9, memoised per vocabulary size."""
    v = _index_cache.get(vocab)
    if v is None:
        v = mx.arange(vocab, dtype=mx.uint32)[None, :] * mx.array(_GOLDEN, dtype=mx.uint32)
        mx.eval(v)
        _index_cache[vocab] = v
    return v


def bits_to_uniform(x: mx.array) -> mx.array:
    """uint32 -> float32 (2 * (x >> 9) + 1) / 2^24: exact, in [2^-24, 1 - 2^-24]."""
    odd = (x >> 9) * mx.array(2, dtype=mx.uint32) + mx.array(1, dtype=mx.uint32)
    return odd.astype(mx.float32) * mx.array(2.0**-24, dtype=mx.float32)


def gumbel_noise(keys: mx.array, vocab: int) -> mx.array:
    """(B, V) float32 standard Gumbel noise, -log(-log(u))."""
    return -_log_neg_log(keys, vocab)


def _log_neg_log(keys: mx.array, vocab: int) -> mx.array:
    """log(-log(u)) of the keyed uniforms: the Gumbel noise negated."""
    return mx.log(-mx.log(uniform_noise(keys, vocab)))


def first_argmax(z: mx.array) -> mx.array:
    """Index of the first maximum along the last axis, int32 (V where a row has no maximum,
    i.e. is all NaN): defined without relying on argmax's tie behaviour on any backend."""
    idx, none = _argmax_constants(z.shape[-1])
    m = mx.max(z, axis=-1, keepdims=True)
    return mx.min(mx.where(z == m, idx, none), axis=-1)


_argmax_cache: dict[int, tuple[mx.array, mx.array]] = {}


def _argmax_constants(vocab: int) -> tuple[mx.array, mx.array]:
    """(arange(V) int32, V as an int32 scalar), memoised per vocabulary size. Built from host
    data, so they are graph leaves even when first made inside a compiled function."""
    c = _argmax_cache.get(vocab)
    if c is None:
        c = (mx.array(np.arange(vocab, dtype=np.int32)), mx.array(vocab, dtype=mx.int32))
        _argmax_cache[vocab] = c
    return c


def filter_mask(x: mx.array, cfg: SamplerConfig) -> mx.array | None:
    """Bool (B, V) mask of the tokens top-k, top-p and min-p keep; None when all are off.

    x: float32 logits already divided by the temperature.
    """
    vocab = x.shape[-1]
    keep = None
    neg_inf = mx.array(-math.inf, dtype=mx.float32)
    if 0 < cfg.top_k < vocab:
        kth = mx.sort(x, axis=-1)[:, vocab - cfg.top_k : vocab - cfg.top_k + 1]
        keep = x >= kth
    if cfg.top_p < 1.0:
        xm = x if keep is None else mx.where(keep, x, neg_inf)
        # MLX's own softmax, also inside the mode: a row is the whole vocabulary, the same
        # length in every call, which MLX reduces the same way whatever the batch
        p = _stock.softmax(xm, axis=-1, precise=True)
        ascending = mx.sort(p, axis=-1)
        mass_above = mx.cumsum(ascending, axis=-1, reverse=True, inclusive=False)
        kept = mass_above < mx.array(cfg.top_p, dtype=mx.float32)
        inf = mx.array(math.inf, dtype=mx.float32)
        threshold = mx.min(mx.where(kept, ascending, inf), axis=-1, keepdims=True)
        top_p_keep = p >= threshold
        keep = top_p_keep if keep is None else keep & top_p_keep
    if cfg.min_p > 0.0:
        m = mx.max(x, axis=-1, keepdims=True)
        min_p_keep = (x - m) >= mx.array(math.log(cfg.min_p), dtype=mx.float32)
        keep = min_p_keep if keep is None else keep & min_p_keep
    return keep


def sample(logits: mx.array, keys: mx.array, cfg: SamplerConfig) -> mx.array:
    """(B, V) logits (any float dtype) and (B, 2) uint32 keys -> (B,) int32 tokens."""
    return sample_scaled(scaled_logits(logits, cfg.temperature), keys, cfg)


def sample_scaled(x: mx.array, keys: mx.array, cfg: SamplerConfig) -> mx.array:
    """`sample` from float32 logits already divided by the temperature (`scaled_logits`)."""
    if cfg.greedy:
        return first_argmax(x)
    # x + gumbel_noise as x - log(-log(u)): IEEE defines a - b as a + (-b), so the sum has
    # the same bits, one negation pass fewer.
    z = x - _log_neg_log(keys, x.shape[-1])
    keep = filter_mask(x, cfg)
    if keep is not None:
        z = mx.where(keep, z, mx.array(-math.inf, dtype=mx.float32))
    return first_argmax(z)


# BI_RL_FUSED_DRAW=0: the engine draws with the MLX ops on every backend (an A/B of `draw`)
FUSED_ENV = "BI_RL_FUSED_DRAW"


def draw(logits: mx.array, x: mx.array, keys: mx.array, cfg: SamplerConfig):
    """(tokens, row fingerprints) of a decode step: `sample_scaled(x, keys, cfg)` and
    `row_fingerprints(logits)`, x being `scaled_logits(logits, cfg.temperature)`.

    On the CUDA backend, greedy or with no filter on, one pass over the logits computes both
    (bi_rl.backends.cuda.sample_kernel: the same float operations on every element, then an
    exact maximum and exact integer sums), so the bits are those of the MLX ops; elsewhere, or
    with BI_RL_FUSED_DRAW=0, the MLX ops themselves."""
    if cfg.greedy or filter_mask_off(cfg):
        fused = _fused_draw(logits, keys, cfg.temperature, cfg.greedy)
        if fused is not None:
            return fused
    return sample_scaled(x, keys, cfg), row_fingerprints(logits)


def fingerprints(logits: mx.array) -> mx.array:
    """`row_fingerprints` of (rows, V) logits: on the CUDA backend the fingerprint half of
    `draw`'s one pass (its greedy form, with keys it does not read), the same integers without
    the MLX ops' (rows, V) uint32 temporaries; elsewhere, or with BI_RL_FUSED_DRAW=0, the MLX
    ops. The scorer fingerprints its rows through this."""
    if logits.ndim == 2:
        fused = _fused_draw(logits, None, 1.0, True)
        if fused is not None:
            return fused[1]
    return row_fingerprints(logits)


def _fused_draw(logits: mx.array, keys: mx.array | None, temperature: float, greedy: bool):
    """bi_rl.backends.cuda.sample_kernel.draw where the CUDA backend serves this thread and
    BI_RL_FUSED_DRAW is not 0; None where it does not apply (the caller runs the MLX ops).
    keys None: zeros, for a greedy draw that does not read them."""
    if os.environ.get(FUSED_ENV, "") == "0":
        return None
    from bi_rl import backends

    if backends.active().name != "cuda":
        return None
    from bi_rl.backends.base import Unsupported
    from bi_rl.backends.cuda import sample_kernel

    if keys is None:
        keys = mx.zeros((logits.shape[0], 2), dtype=mx.uint32)
    index_hash = fingerprint_index_hash(logits.shape[-1])
    try:
        return sample_kernel.draw(logits, keys, index_hash, temperature, greedy)
    except Unsupported:
        return None


def filter_mask_off(cfg: SamplerConfig) -> bool:
    """Whether `filter_mask` keeps every token (top-k, top-p and min-p all off)."""
    return cfg.top_k == 0 and cfg.top_p >= 1.0 and cfg.min_p <= 0.0
