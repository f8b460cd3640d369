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
from conftest import bits, rand, stock_is_invariant

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


# -- the matmuls of mixture-of-experts layers and of attention written by hand ---------------
# The mode replaces these; on the CPU backend it routes them to stock, which these tests prove
# invariant there. The routers' top-k and softmax stay stock on every backend.


def _moe_inputs(dtype, tokens=33, experts=8, dim=64, out=48):
    w = rand((experts, out, dim), dtype, key=21, scale=0.2)
    x = rand((tokens, 1, 1, dim), dtype, key=22)
    idx = mx.random.randint(0, experts, (tokens, 2), key=mx.random.key(23)).astype(mx.uint32)
    return w, x, idx


@stock_is_invariant
@pytest.mark.parametrize(
    "kind", ["gather_mm f32", "gather_qmm f32", "gather_qmm bf16", "gather_qmm f16"]
)
def test_stock_gathers_give_a_token_the_same_bits_in_any_batch(kind):
    """Stock gather_mm (float32 only on the CPU) and gather_qmm compute each gathered matrix
    alone, so the CPU backend routes them to stock."""
    op, dname = kind.split()
    w, x, idx = _moe_inputs(DTYPES[dname])
    if op == "gather_mm":
        run = lambda rows: mx.gather_mm(x[rows], w.swapaxes(-1, -2), rhs_indices=idx[rows])
    else:
        wq, sc, bi = mx.quantize(w, group_size=32, bits=4)
        run = lambda rows: mx.gather_qmm(
            x[rows], wq, sc, bi, rhs_indices=idx[rows], group_size=32, bits=4
        )
    together = bits(run(mx.arange(33)))
    for t in (0, 7, 8, 32):
        alone = bits(run(mx.array([t])))[0]
        assert np.array_equal(together[t], alone), f"{kind}: token {t} moved in a batch of 33"
    assert not np.array_equal(together[0], together[7]), "tokens must differ to prove anything"


@stock_is_invariant
def test_stock_gather_mm_refuses_half_precision_on_the_cpu():
    """Why the CPU backend composes half-precision gather_mm from GEMMs instead."""
    w, x, idx = _moe_inputs(mx.bfloat16)
    with pytest.raises(RuntimeError, match="float32"):
        mx.eval(mx.gather_mm(x, w.swapaxes(-1, -2), rhs_indices=idx))


@stock_is_invariant
@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
def test_stock_batched_matmul_gives_a_query_row_the_same_bits_in_any_batch(dtype):
    """q @ k^T and p @ v as Gemma 2 writes them (grouped heads, a broadcast group axis)."""
    q = rand((4, 2, 2, 9, 64), dtype, key=24)
    k = rand((4, 2, 1, 13, 64), dtype, key=25)
    scores = q @ k.swapaxes(-1, -2)
    p = mx.softmax(scores.astype(mx.float32), axis=-1).astype(dtype)
    out = p @ k
    for b, i in ((0, 0), (3, 8), (1, 4)):
        s_alone = q[b : b + 1, :, :, i : i + 1] @ k[b : b + 1].swapaxes(-1, -2)
        assert np.array_equal(bits(s_alone)[0, :, :, 0], bits(scores)[b, :, :, i])
        o_alone = p[b : b + 1, :, :, i : i + 1] @ k[b : b + 1]
        assert np.array_equal(bits(o_alone)[0, :, :, 0], bits(out)[b, :, :, i])


# The top-k routers of mlx-lm's MoE families, as their MoE blocks write them (k = 2):
# gate logits g -> (expert indices, expert weights).
def _mixtral(g):
    i = mx.argpartition(-g, kth=1, axis=-1)[..., :2]
    return i, mx.softmax(mx.take_along_axis(g, i, axis=-1), axis=-1, precise=True)


def _qwen3_moe(g):
    p = mx.softmax(g, axis=-1, precise=True)
    i = mx.argpartition(p, kth=-2, axis=-1)[..., -2:]
    s = mx.take_along_axis(p, i, axis=-1)
    return i, s / s.sum(axis=-1, keepdims=True)


def _gpt_oss(g):
    i = mx.argpartition(g, kth=-2, axis=-1)[..., -2:]
    return i, mx.softmax(mx.take_along_axis(g, i, axis=-1), axis=-1, precise=True)


ROUTERS = {"mixtral": _mixtral, "qwen3_moe": _qwen3_moe, "gpt_oss": _gpt_oss}


@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
@pytest.mark.parametrize("family", ["mixtral", "qwen3_moe", "gpt_oss"])
def test_router_top_k_and_softmax_are_row_local_with_ties(family, dtype):
    """A token's experts (their order too) and weights do not depend on the other tokens,
    also when gate logits tie at, above and across the top-k boundary."""
    g = rand((64, 16), dtype, key=26, scale=2.0)
    g[0] = mx.zeros((16,), dtype)  # every expert ties
    g[1, :] = -1.0
    g[1, 3] = g[1, 9] = g[1, 12] = 0.5  # three tie for two slots
    g[2, 5] = g[2, 6] = g[2].max() + 1.0  # the top two tie
    g[3] = mx.array([1.0, 2.0] * 8, dtype=dtype)  # eight tie at the top
    route = ROUTERS[family]
    idx, wts = route(g)
    for r in (0, 1, 2, 3, 40, 63):
        i_alone, w_alone = route(g[r : r + 1])
        assert np.array_equal(np.array(i_alone)[0], np.array(idx)[r]), f"row {r} picked others"
        assert np.array_equal(bits(w_alone)[0], bits(wts)[r]), f"row {r}'s weights moved"
    picked = set(np.array(idx)[1].tolist())
    assert len(picked) == 2 and picked <= {3, 9, 12}, "the tie must be at the top-k boundary"
