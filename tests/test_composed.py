"""bi_rl.backends.composed: batched and gathered matmuls from a backend's 2-D GEMMs.

Properties: with the CPU's stock GEMMs underneath (CPU only: stock is the invariant GEMM
there), the composed gather_mm, gather_qmm and batched matmul give stock MLX's bits for
every index form mlx-lm uses (SwitchGLU unsorted and sorted, explicit lhs indices, no
indices) and every batch broadcast of hand-written attention, with one 2-D GEMM per distinct
expert / batch element of b. With the active backend's GEMM underneath, each token's result
is the same computed alone or with others. Aligned rows ignore leading zeros (masked keys).
Negative controls: under a 2-D GEMM whose bits depend on how many rows it is given, the
alone-vs-together comparison fails, and under one that rounds K chunks counted from k = 0,
unaligned rows see leading zeros; so the composed ops are exactly as invariant as the GEMM
they are built on.
"""

from __future__ import annotations

import collections

import mlx.core as mx
import numpy as np
import pytest
from conftest import bits, differing, rand, stock_is_invariant

from bi_rl import _stock, backends
from bi_rl.backends import composed

# The backend's own invariant 2-D GEMMs (stock MLX's on the CPU, the kernels on CUDA).
MATMUL = backends.active().ops["matmul"]

E, D, H, T, K = 6, 64, 48, 40, 2


def counting(fn):
    calls = collections.Counter()

    def wrapped(*args):
        calls[args[0].shape[0]] += 1
        return fn(*args)

    return wrapped, calls


def row_count_sensitive(a, b):
    """A deliberately variant 2-D GEMM: its bits depend on the number of rows it is given."""
    return _stock.matmul(a, b) * (1 + a.shape[0] / 64)


def routed(dtype, key=0):
    w = rand((E, H, D), dtype, key=key + 1, scale=0.2)  # SwitchLinear layout (E, out, in)
    x = rand((T, D), dtype, key=key + 2)
    idx = mx.random.randint(0, E, (T, K), key=mx.random.key(key + 3)).astype(mx.uint32)
    idx[3] = mx.array([5, 5], dtype=mx.uint32)  # a token routed twice to one expert
    return w, x, idx


def switch_gather(gather, x, idx, sort: bool):
    """How mlx-lm's SwitchGLU calls a gather: x (T, 1, 1, D), sorted or unsorted indices."""
    xe = mx.expand_dims(x, (-2, -3))
    if not sort:
        return gather(xe, idx)
    flat = idx.flatten()
    order = mx.argsort(flat)
    out = gather(xe.flatten(0, -3)[order // K], flat[order])
    return out[mx.argsort(order)].reshape(T, K, 1, -1)


@stock_is_invariant
@pytest.mark.parametrize("sort", [False, True], ids=["unsorted", "sorted"])
def test_gather_mm_gives_stock_bits_and_one_gemm_per_expert(sort):
    w, x, idx = routed(mx.float32)
    wt = w.swapaxes(-1, -2)
    stock = switch_gather(lambda a, i: _stock.gather_mm(a, wt, rhs_indices=i), x, idx, sort)
    mm, calls = counting(_stock.matmul)
    ours = switch_gather(lambda a, i: composed.gather_mm(mm, a, wt, None, i, sort), x, idx, sort)
    assert ours.shape == stock.shape == (T, K, 1, H)
    assert differing(ours, stock) == 0
    per_expert = np.bincount(np.array(idx).ravel(), minlength=E)
    assert sorted(calls.elements()) == sorted(n for n in per_expert if n), "one GEMM per expert"


@stock_is_invariant
def test_gather_mm_with_explicit_and_missing_indices():
    a, b = rand((4, 3, 16)), rand((5, 16, 8), key=1)
    cases = [
        (
            a,
            mx.array([[0, 3], [2, 2]], dtype=mx.uint32),
            mx.array([[4, 1], [1, 0]], dtype=mx.uint32),
        ),
        (a, mx.array([0, 3, 2, 2, 1], dtype=mx.uint32), None),  # every b in order
        (a, None, mx.array([4, 4, 0, 1], dtype=mx.uint32)),  # every a in order
        (a[:1], None, None),  # a plain batched matmul, a broadcast over b's batch
    ]
    for aa, li, ri in cases:
        want = _stock.gather_mm(aa, b, li, ri)
        got = composed.gather_mm(_stock.matmul, aa, b, li, ri)
        assert got.shape == want.shape and differing(got, want) == 0, (li, ri)


@stock_is_invariant
@pytest.mark.parametrize("bits_", [4, 8])
@pytest.mark.parametrize("dtype", [mx.float32, mx.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("sort", [False, True], ids=["unsorted", "sorted"])
def test_gather_qmm_gives_stock_bits(sort, dtype, bits_):
    w, x, idx = routed(dtype, key=10)
    wq, sc, bi = mx.quantize(w, group_size=32, bits=bits_)
    q = dict(transpose=True, group_size=32, bits=bits_)

    def stock(a, i):
        return _stock.gather_qmm(a, wq, sc, bi, rhs_indices=i, **q)

    def ours(a, i):
        return composed.gather_qmm(_stock.quantized_matmul, a, wq, sc, bi, None, i, **q)

    assert differing(switch_gather(ours, x, idx, sort), switch_gather(stock, x, idx, sort)) == 0


@pytest.mark.parametrize("dtype", [mx.float32, mx.bfloat16], ids=["f32", "bf16"])
def test_a_tokens_expert_outputs_do_not_depend_on_the_other_tokens(dtype):
    w, x, idx = routed(dtype, key=20)
    wt = w.swapaxes(-1, -2)

    def run(matmul, rows):
        return composed.gather_mm(matmul, mx.expand_dims(x[rows], (-2, -3)), wt, None, idx[rows])

    tokens = [0, 3, 17, T - 1]
    together = bits(run(MATMUL, mx.arange(T)))
    for t in tokens:
        alone = bits(run(MATMUL, mx.array([t])))[0]
        assert np.array_equal(together[t], alone), f"token {t} moved with company"
    # Negative control: a GEMM whose bits depend on its row count breaks the same check.
    together = bits(run(row_count_sensitive, mx.arange(T)))
    moved = [
        t
        for t in tokens
        if not np.array_equal(together[t], bits(run(row_count_sensitive, mx.array([t])))[0])
    ]
    assert moved, "a row-count-sensitive GEMM must show up as variant"


# (a shape, b shape) pairs: hand-written grouped-query attention (scores and p @ v), b
# broadcast over a leading axis, a broadcast over the batch, and a 2-D left operand.
BATCHED = [
    ((3, 2, 2, 5, 16), (3, 2, 1, 16, 7)),
    ((3, 2, 2, 5, 7), (3, 2, 1, 7, 16)),
    ((2, 4, 5, 16), (1, 4, 16, 9)),
    ((1, 4, 5, 16), (3, 4, 16, 9)),
    ((5, 16), (3, 16, 9)),
    ((3, 5, 16), (1, 16, 9)),  # b's batch axis broadcast: one GEMM of 15 rows
]


@stock_is_invariant
@pytest.mark.parametrize("dtype", [mx.float32, mx.bfloat16, mx.float16], ids=["f32", "bf16", "f16"])
@pytest.mark.parametrize("shapes", BATCHED, ids=[str(s) for s in BATCHED])
def test_batched_matmul_gives_stock_bits_one_gemm_per_batch_element(shapes, dtype):
    sa, sb = shapes
    a, b = rand(sa, dtype, key=30), rand(sb, dtype, key=31)
    mm, calls = counting(_stock.matmul)
    got = composed.batched_matmul(mm, a, b)
    want = _stock.matmul(a, b)
    assert got.shape == want.shape and differing(got, want) == 0
    assert sum(calls.values()) == int(np.prod([n for n in sb[:-2] if n > 1] or [1]))


def test_batched_matmul_rows_do_not_depend_on_the_other_rows():
    q, k = rand((3, 2, 2, 9, 16), key=40), rand((3, 2, 1, 11, 16), key=41)

    def scores(matmul, rows):
        return composed.batched_matmul(matmul, q[:, :, :, rows], k.swapaxes(-1, -2))

    for matmul, variant in ((MATMUL, False), (row_count_sensitive, True)):
        together = bits(scores(matmul, slice(0, 9)))
        alone = np.concatenate([bits(scores(matmul, slice(i, i + 1))) for i in range(9)], axis=3)
        assert np.array_equal(together, alone) != variant, "the negative control must differ"


def chunk_rounding(a, b):
    """A deliberately shift-sensitive 2-D GEMM, like a kernel that groups K in chunks counted
    from k = 0: each 4-column chunk's partial product is rounded to bfloat16, then summed."""
    out = mx.zeros((a.shape[0], b.shape[1]), mx.float32)
    for c in range(0, a.shape[1], 4):
        part = _stock.matmul(a[:, c : c + 4], b[c : c + 4]).astype(mx.bfloat16)
        out = out + part.astype(mx.float32)
    return out


@pytest.mark.parametrize("pad", [1, 3, 6])
def test_aligned_rows_ignore_leading_masked_keys(pad):
    """p @ v as a decode step sees it (masked keys first: left padding) equals p @ v as a full
    forward pass sees it (masked keys last: causal), row for row, with align; without, a
    GEMM that groups K from k = 0 tells them apart."""
    L, S, D = 6, 6, 16
    p = mx.softmax(rand((2, 2, L, S), key=50), axis=-1) * mx.tril(mx.ones((L, S)))  # causal
    v = rand((2, 1, S, D), key=51)
    garbage = rand((2, 1, pad, D), key=52, scale=100.0)
    p_dec = mx.concatenate([mx.zeros((2, 2, L, pad)), p], axis=-1)  # masked keys first
    v_dec = mx.concatenate([garbage, v], axis=-2)
    for matmul in (MATMUL, chunk_rounding):
        full = bits(composed.batched_matmul(matmul, p, v, align=True))
        dec = bits(composed.batched_matmul(matmul, p_dec, v_dec, align=True))
        assert np.array_equal(full, dec), f"{matmul.__name__}: aligned rows moved"
    plain = bits(composed.batched_matmul(chunk_rounding, p_dec, v_dec))
    assert not np.array_equal(full, plain), "without align the chunked GEMM must differ"


@stock_is_invariant
def test_aligned_rows_give_stock_bits_on_the_cpu():
    """Starting a row late skips only exact zeros: the same bits as stock's full reduction."""
    p = mx.softmax(rand((2, 2, 6, 9), key=53), axis=-1) * mx.tril(mx.ones((6, 9)), k=3)
    p = mx.concatenate([mx.zeros((2, 2, 6, 3)), p], axis=-1)  # leading masked keys
    v = rand((2, 1, 12, 16), key=54)
    got = composed.batched_matmul(_stock.matmul, p, v, align=True)
    assert differing(got, _stock.matmul(p, v)) == 0
