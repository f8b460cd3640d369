"""CUDA GEMM kernels (bi_rl/backends/cuda/gemm.py), on the device only.

Properties: a row's output bits depend neither on how many rows share the call (M = 1..512,
both sides of 7/8, 16, 64, 256) nor on the tile configuration; every layout (nn.Linear W,
a W.T view, a row-major b, strided x) gives the same bits; every output element is written;
indices past 2^31 are right; accuracy against float64 is within the stated tolerance. Stock
MLX on the same inputs is the negative control: it must show the variance we remove.
"""

from __future__ import annotations

import math

import mlx.core as mx
import numpy as np
import pytest
from conftest import bits, f64, rand, relerr

from bi_rl import _stock
from bi_rl.backends.base import Unsupported
from bi_rl.backends.cuda import gemm as G

pytestmark = pytest.mark.skipif(not mx.cuda.is_available(), reason="needs MLX's CUDA backend")

DTYPES = {"bfloat16": mx.bfloat16, "float16": mx.float16, "float32": mx.float32}
# Relative Frobenius error against float64 (inputs rounded to the dtype first).
TOLERANCE = {"bfloat16": 5e-3, "float16": 1e-3, "float32": 1e-6}
MS = (1, 2, 3, 7, 8, 9, 15, 16, 17, 33, 63, 64, 65, 127, 128, 129, 255, 256, 257, 511, 512)
SHAPES = ((896, 4864), (4864, 896), (1000, 131))  # (K, N); the last: tail k-block, odd N


def _problem(dtype, k, n, key=0):
    x = rand((512, k), dtype, key)
    w = rand((n, k), dtype, key + 1, scale=k**-0.5)
    b = rand((n,), dtype, key + 2)
    return x, w, b


CASES = [("bfloat16", s) for s in SHAPES] + [(d, SHAPES[-1]) for d in ("float16", "float32")]


@pytest.mark.parametrize("dtype,shape", CASES, ids=lambda c: str(c))
def test_each_row_has_the_same_bits_for_every_batch_size(dtype, shape):
    k, n = shape
    x, w, b = _problem(DTYPES[dtype], k, n)
    full = bits(G.linear(x, w, b))
    for m in MS:
        got = bits(G.linear(x[:m], w, b))
        bad = int((got != full[:m]).sum())
        assert bad == 0, f"M={m}: {bad} of {got.size} outputs differ from the same rows at M=512"
    for i in (0, 6, 7, 8, 255, 511):
        alone = bits(G.linear(x[i : i + 1], w, b))
        assert (alone[0] == full[i]).all(), f"row {i} alone differs from row {i} of a batch"
    used = {G.choose_config(DTYPES[dtype], m, n, k) for m in MS}
    assert len(used) >= 3, f"the sweep exercised only {used}"


@pytest.mark.parametrize("dtype", DTYPES)
def test_stock_matmul_is_batch_variant_here(dtype):
    """Negative control: the same sweep through stock MLX finds differing bits."""
    k, n = 4864, 896
    x, w, b = _problem(DTYPES[dtype], k, n)
    full = bits(_stock.addmm(b, x, w.T))
    bad = sum(int((bits(_stock.addmm(b, x[:m], w.T)) != full[:m]).sum()) for m in MS)
    assert bad > 0, "stock MLX was invariant on this sweep: the control proves nothing"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m", (1, 8, 37, 64))
def test_every_tile_configuration_gives_the_same_bits(dtype, m):
    dt = DTYPES[dtype]
    for k, n in ((1000, 200), (999, 131)):  # vector path with a tail k-block; scalar path
        x, w, b = rand((m, k), dt, 3), rand((n, k), dt, 4, scale=0.05), rand((n,), dt, 5)
        cfgs = G.configs(dt)
        if dt != mx.float32:  # a spread of the skinny ones, and every tiled one
            cfgs = [c for c in cfgs if c.kind == "tiled"] + [
                G.GemmConfig("skinny", mt=mt, nt=nt, wk=wk)
                for mt, nt, wk in ((1, 1, 1), (1, 2, 3), (2, 1, 8), (3, 1, 4), (4, 2, 2))
            ]
        want = bits(G.gemm(x, w, b_kn=False, c=b, config=cfgs[0]))
        for cfg in cfgs[1:]:
            got = bits(G.gemm(x, w, b_kn=False, c=b, config=cfg))
            assert (got == want).all(), f"{cfg} differs from {cfgs[0]} at M={m} K={k} N={n}"


@pytest.mark.parametrize("dtype", DTYPES)
def test_layouts_and_strides_give_the_same_bits(dtype):
    dt = DTYPES[dtype]
    big = rand((40, 1200), dt, 6)
    x = big[:, 100:1100]  # rows strided by 1200, read in place
    w, b = rand((96, 1000), dt, 7, scale=0.03), rand((96,), dt, 8)
    want = bits(G.linear(mx.contiguous(x), w, b))
    assert (bits(G.linear(x, w, b)) == want).all(), "strided x"
    assert (bits(G.addmm(b, x, w.T)) == want).all(), "addmm(b, x, W.T view)"
    assert (bits(G.addmm(b, x, mx.contiguous(w.T))) == want).all(), "row-major (K, N) b"
    plain = bits(G.linear(x, w))
    assert (bits(G.matmul(x, w.T)) == plain).all(), "matmul(x, W.T view)"
    x3 = mx.contiguous(x).reshape(4, 10, 1000)
    assert (bits(G.linear(x3, w, b)).reshape(40, 96) == want).all(), "3-D activations"


@pytest.mark.parametrize("dtype", DTYPES)
def test_every_output_is_written(dtype):
    dt = DTYPES[dtype]
    for m in (1, 9, 300):
        x, w, b = rand((m, 1000), dt, 9), rand((131, 1000), dt, 10, scale=0.03), rand((131,), dt)
        got = G.gemm(x, w, b_kn=False, c=b, poison=float("nan"))
        assert not np.isnan(f64(got)).any(), f"unwritten outputs at M={m}"
        assert (bits(got) == bits(G.linear(x, w, b))).all()


@pytest.mark.parametrize("dtype", DTYPES)
def test_accuracy_against_float64(dtype):
    dt = DTYPES[dtype]
    x, w, b = (
        rand((64, 4096), dt, 11),
        rand((512, 4096), dt, 12, scale=4096**-0.5),
        rand((512,), dt),
    )
    c, alpha, beta = rand((64, 512), dt, 13), 0.5, -2.0
    outs = {m: (G.linear(x[:m], w, b), _stock.linear(x[:m], w, b)) for m in (1, 64)}
    scaled = G.addmm(c, x, w.T, alpha, beta)
    ref = f64(x) @ f64(w).T + f64(b)
    for m, (ours, stock) in outs.items():
        err, err_stock = relerr(ours, ref[:m]), relerr(stock, ref[:m])
        print(f"{dtype} M={m}: ours {err:.2e} stock {err_stock:.2e}")
        assert err < TOLERANCE[dtype], f"relative error {err:.2e} (stock {err_stock:.2e})"
    ref = alpha * (f64(x) @ f64(w).T) + beta * f64(c)
    assert relerr(scaled, ref) < TOLERANCE[dtype]


def test_logits_gemm_past_two_to_the_31():
    """16384 x 151936 outputs: element indices pass 2^31; 64-bit arithmetic keeps them right."""
    m, n, k = 16384, 151936, 128
    assert m * n > 2**31
    x, w = rand((m, k), mx.bfloat16, 14), rand((n, k), mx.bfloat16, 15, scale=k**-0.5)
    out = G.matmul(x, w.T)
    tail = out[-3:]
    mx.eval(tail)
    assert (bits(tail) == bits(G.matmul(x[-3:], w.T))).all(), "last rows differ from alone"
    ref = f64(x[-3:]) @ f64(w).T
    assert relerr(tail, ref) < TOLERANCE["bfloat16"]
    last_col = f64(out[:, -1])
    ref_col = f64(x) @ f64(w[-1])
    assert math.isclose(
        float(np.linalg.norm(last_col - ref_col)), 0.0, abs_tol=1e-2 * np.linalg.norm(ref_col)
    )


def test_refuses_what_it_cannot_make_invariant():
    x = mx.ones((2, 4), dtype=mx.int32)
    with pytest.raises(Unsupported, match="int32"):
        G.matmul(x, x.T)
    with pytest.raises(Unsupported, match="mixed"):
        G.matmul(rand((2, 4), mx.bfloat16), rand((4, 3), mx.float16))
