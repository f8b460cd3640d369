"""Regression guard: the row-wise ops the mode does not replace stay batch-invariant.

rms_norm, layer_norm, softmax, logsumexp, RoPE and embedding lookup run stock inside the
mode on every backend; MLX computes them one row at a time today. A future MLX that splits
a row's reduction by batch size, or computes RoPE differently for array and scalar offsets,
fails here. Every comparison is on bit patterns.
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from conftest import bits, rand

BATCHES = (1, 2, 7, 8, 9, 64, 257)
DTYPES = {"f32": mx.float32, "f16": mx.float16, "bf16": mx.bfloat16}
DIMS = (64, 896, 4097)


def rowwise_ops(dim, dtype):
    w, b = rand((dim,), dtype, key=7), rand((dim,), dtype, key=8)
    return {
        "rms_norm": lambda x: mx.fast.rms_norm(x, w, 1e-6),
        "layer_norm": lambda x: mx.fast.layer_norm(x, w, b, 1e-5),
        "softmax": lambda x: mx.softmax(x, axis=-1, precise=True),
        "logsumexp": lambda x: mx.logsumexp(x.astype(mx.float32), axis=-1),
        "log_softmax_f32": lambda x: nn.log_softmax(x.astype(mx.float32), axis=-1),
    }


@pytest.mark.parametrize("dim", DIMS)
@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
def test_rowwise_ops_give_a_row_the_same_bits_in_any_batch(dtype, dim):
    x = rand((max(BATCHES), dim), dtype, key=dim, scale=3.0)
    for name, op in rowwise_ops(dim, dtype).items():
        alone = [bits(op(x[i : i + 1]))[0] for i in (0, 6, 7, 8, 63, 256)]
        assert not np.array_equal(alone[0], alone[1]), f"{name}: rows must differ to prove anything"
        for batch in BATCHES:
            together = bits(op(x[:batch]))
            for j, i in enumerate((0, 6, 7, 8, 63, 256)):
                if i < batch:
                    assert np.array_equal(together[i], alone[j]), (
                        f"{name} {dtype} dim {dim}: row {i} differs in a batch of {batch}"
                    )


@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
@pytest.mark.parametrize("traditional", [False, True])
def test_rope_array_offsets_match_scalar_offsets(dtype, traditional):
    """mlx-lm's BatchKVCache passes one offset per sequence; alone it passes an int."""
    batch, heads, length, dims = 5, 4, 9, 64
    x = rand((batch, heads, length, dims), dtype, key=11)
    offsets = [0, 3, 255, 256, 4097]
    rope = lambda a, off: mx.fast.rope(
        a, dims, traditional=traditional, base=10000.0, scale=1.0, offset=off
    )
    together = bits(rope(x, mx.array(offsets)))
    for i, off in enumerate(offsets):
        alone = bits(rope(x[i : i + 1], off))[0]
        assert np.array_equal(together[i], alone), f"sequence {i} (offset {off}) moved"
    # Guard: the offsets really move the rotation.
    assert not np.array_equal(bits(rope(x[1:2], 0)), bits(rope(x[1:2], 3)))


@pytest.mark.parametrize("quantized", [False, True], ids=["dense", "4bit"])
def test_embedding_lookup_is_a_pure_gather(quantized):
    mx.random.seed(3)
    emb = nn.Embedding(1000, 128)
    emb.set_dtype(mx.bfloat16)
    if quantized:
        emb = nn.QuantizedEmbedding.from_embedding(emb, group_size=64, bits=4)
    ids = mx.array([[5, 999, 0, 5], [17, 5, 3, 2]])
    together = bits(emb(ids))
    for r in range(2):
        for c in range(4):
            alone = bits(emb(ids[r : r + 1, c : c + 1]))[0, 0]
            assert np.array_equal(together[r, c], alone)
    assert np.array_equal(together[0, 0], together[1, 1]), "same id, same row, any position"
    assert not np.array_equal(together[0, 0], together[0, 1])
