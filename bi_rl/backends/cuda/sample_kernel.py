"""The rollout engine's keyed draw and row fingerprint as two CUDA launches.

kernels/cuda/sample.cu computes, in one pass over the raw logits, what
bi_rl.rollout.sampler.sample_scaled (no filters) and bi_rl.logprobs.row_fingerprints compute
with about fifteen MLX ops: the same float operations on every element (division by T, the
keyed uniform, two logf, a subtraction), then the first maximum and the wrapping integer
lane sums, which no split of the row can change. So the token and the fingerprint have the
bits the MLX ops give (the GPU tests compare them on every dtype, temperature and awkward
row), while the logits are read once instead of materialised a dozen times as float32
temporaries, and the decode step queues two kernels where it queued fifteen.

`draw(logits, keys, index_hash, temperature, greedy)` -> (tokens int32 (B,), fingerprints
uint32 (B, 2)), Unsupported where the kernel does not apply (a dtype or rank it does not read).
index_hash is bi_rl.logprobs.fingerprint_index_hash(V), the two lanes' per-index hashes.
"""

from __future__ import annotations

from functools import cache

import mlx.core as mx

from bi_rl.backends.base import Unsupported
from bi_rl.backends.cuda._kernels import KernelSpec, cdiv, kernel

THREADS = 256  # SAMPLE_THREADS
CHUNK = 4096  # SAMPLE_CHUNK: columns a partial block covers
COMBINE_THREADS = 64
MAX_ROWS = 65535  # a row is a block row of the partial kernel's grid (gridDim.y)
FILES = ("cuda/common.cuh", "cuda/sample.cu")
DTYPES = (mx.bfloat16, mx.float16, mx.float32)

_PARTIAL = """
  const int vocab = logits_shape[1];
  bi::sample_partial<T, GREEDY>(logits, logits_strides[0], logits_strides[1], keys,
                                keys_strides[0], keys_strides[1], index_hash, t[0], partial,
                                vocab, (vocab + bi::SAMPLE_CHUNK - 1) / bi::SAMPLE_CHUNK);
"""
_COMBINE = """
  bi::sample_combine(partial, tokens, fingerprints, partial_shape[0], partial_shape[1], VOCAB);
"""


@cache
def partial_spec() -> KernelSpec:
    return KernelSpec(
        "bi_sample_partial", ("logits", "keys", "index_hash", "t"), ("partial",), FILES, _PARTIAL
    )


@cache
def combine_spec() -> KernelSpec:
    return KernelSpec(
        "bi_sample_combine", ("partial",), ("tokens", "fingerprints"), FILES, _COMBINE
    )


@cache
def _partial_kernel(dtype, greedy: bool):
    return kernel(partial_spec()).baked([("T", dtype), ("GREEDY", greedy)])


@cache
def _combine_kernel(vocab: int):
    return kernel(combine_spec()).baked([("VOCAB", vocab)])


_temperatures: dict[float, mx.array] = {}


def _t(temperature: float) -> mx.array:
    """The temperature as a one-element float32 array, memoised (a graph leaf, built once)."""
    t = _temperatures.get(temperature)
    if t is None:
        t = _temperatures[temperature] = mx.array([temperature], dtype=mx.float32)
    return t


def draw(logits: mx.array, keys: mx.array, index_hash: mx.array, temperature: float, greedy: bool):
    """(tokens, fingerprints) of (B, V) logits: sample_scaled's tokens for float32(logits) / T
    with no filters (greedy: the first argmax, T = 1) and row_fingerprints of the logits."""
    if logits.ndim != 2 or logits.dtype not in DTYPES:
        raise Unsupported(f"fused draw of {logits.dtype} logits of shape {tuple(logits.shape)}")
    rows, vocab = logits.shape
    if not (0 < rows <= MAX_ROWS and 0 < vocab < 2**31 - 1):
        raise Unsupported(f"fused draw of logits of shape {tuple(logits.shape)}")
    if keys.shape != (rows, 2) or keys.dtype != mx.uint32:
        raise ValueError(f"keys must be ({rows}, 2) uint32, got {keys.dtype} {tuple(keys.shape)}")
    if index_hash.shape != (2, vocab) or index_hash.dtype != mx.uint32:
        raise ValueError(f"index_hash must be (2, {vocab}) uint32, got {tuple(index_hash.shape)}")
    chunks = cdiv(vocab, CHUNK)
    (partial,) = _partial_kernel(logits.dtype, greedy)(
        inputs=[logits, keys, index_hash, _t(1.0 if greedy else temperature)],
        template=[],
        grid=(chunks * THREADS, rows, 1),
        threadgroup=(THREADS, 1, 1),
        output_shapes=[(rows, chunks, 4)],
        output_dtypes=[mx.uint32],
    )
    tokens, fingerprints = _combine_kernel(vocab)(
        inputs=[partial],
        template=[],
        grid=(cdiv(rows, COMBINE_THREADS) * COMBINE_THREADS, 1, 1),
        threadgroup=(COMBINE_THREADS, 1, 1),
        output_shapes=[(rows,), (rows, 2)],
        output_dtypes=[mx.int32, mx.uint32],
    )
    return tokens, fingerprints
