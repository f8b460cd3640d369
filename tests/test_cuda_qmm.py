"""CUDA quantized GEMM (bi_rl/backends/cuda/qmm.py), on the device only.

Properties: for MLX affine weights of every bit width and group size, a row's output bits do
not depend on M (both sides of stock's qmv/qmm switch at 8) or on the tile configuration;
every output is written; the result matches float64 on the dequantised weights; stock MLX on
the same inputs is variant (negative control); what is not affine raises Unsupported.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from conftest import bits, f64, rand

from bi_rl import _stock
from bi_rl.backends.base import Unsupported
from bi_rl.backends.cuda import gemm as G
from bi_rl.backends.cuda import hopper, hopper_qmm
from bi_rl.backends.cuda.qmm import quantized_matmul

pytestmark = pytest.mark.skipif(not mx.cuda.is_available(), reason="needs MLX's CUDA backend")

MS = (1, 2, 7, 8, 9, 16, 17, 64, 65, 300)


def _weights(n, k, bits_, group, dtype=mx.bfloat16, key=1):
    w = rand((n, k), dtype, key, scale=k**-0.5)
    return mx.quantize(w, group_size=group, bits=bits_)


@pytest.mark.parametrize(
    "bits_,group", [(4, 32), (4, 64), (4, 128), (2, 64), (3, 64), (5, 128), (6, 32), (8, 64)]
)
def test_each_row_has_the_same_bits_for_every_batch_size(bits_, group):
    k, n = 1024, 200
    x = rand((max(MS), k), mx.bfloat16, 2)
    wq, s, b = _weights(n, k, bits_, group)
    f = lambda a: quantized_matmul(a, wq, s, b, True, group, bits_, "affine")
    full = bits(f(x))
    for m in MS if bits_ == 4 else (1, 8, 9):
        got = bits(f(x[:m]))
        bad = int((got != full[:m]).sum())
        assert bad == 0, f"M={m}: {bad} of {got.size} outputs differ from the same rows at M=300"
    for i in (0, 7, 8, 299):
        assert (bits(f(x[i : i + 1]))[0] == full[i]).all(), f"row {i} alone differs"


def test_float32_activations_keep_their_bits_at_every_batch_size():
    """float32 x with bf16-quantized weights (the dequantised weight on the float32 GEMM):
    invariant across the batch sizes where stock switches kernels, and accurate."""
    k, n = 1024, 200
    x = rand((max(MS), k), mx.float32, 4)
    wq, s, b = _weights(n, k, 4, 64)
    f = lambda a: quantized_matmul(a, wq, s, b, True, 64, 4, "affine")
    full = bits(f(x))
    for m in (1, 7, 8, 9, 65):
        bad = int((bits(f(x[:m])) != full[:m]).sum())
        assert bad == 0, f"M={m}: {bad} float32 outputs differ from the same rows at M=300"
    w = mx.dequantize(wq, s, b, group_size=64, bits=4)
    ref = f64(x) @ f64(w).T
    err = float(np.linalg.norm(f64(f(x)) - ref) / np.linalg.norm(ref))
    assert err < 1e-5, f"relative error {err:.2e} against float64 (float32 GEMM, no TF32)"


@pytest.mark.skipif(not hopper.available(), reason="needs a Hopper GPU and NVRTC")
@pytest.mark.parametrize("bits_", [4, 8, 3])
def test_activations_of_any_rank_give_the_bits_of_their_rows(bits_):
    """A (B, T, K) activation goes to the Hopper kernel as it is: the bits of its rows as a 2-D
    operand, also for a non-contiguous view, and the launch is the rank-free one."""
    k, n = 1024, 200
    wq, s, b = _weights(n, k, bits_, 64)
    big = rand((4, 40, k), mx.bfloat16, 5)
    f = lambda a: quantized_matmul(a, wq, s, b, True, 64, bits_, "affine")
    for x3 in (big[:1, :1], big[:3, :1], big[:2, :9], big[:, ::2], big[:2].swapaxes(0, 1)):
        flat = mx.array(np.array(x3.astype(mx.float32))).astype(mx.bfloat16).reshape(-1, k)
        got, want = f(x3), f(flat).reshape(*x3.shape[:-1], n)
        assert tuple(got.shape) == tuple(want.shape)
        assert (bits(got) == bits(want)).all(), f"{x3.shape}: rank-3 rows differ"
    mx.eval(f(big))
    plan = next(
        p for sig, p in hopper_qmm._PLANS.items() if sig[1] == big.shape and sig[5] == bits_
    )
    assert plan.launch.out_shape == (4, 40, n) and not plan.reshape


def test_stock_quantized_matmul_is_batch_variant_here():
    """Negative control: stock switches from qmv to qmm at 8 rows and the bits move."""
    k, n = 1024, 512
    x = rand((64, k), mx.bfloat16, 3)
    wq, s, b = _weights(n, k, 4, 64)
    f = lambda a: _stock.quantized_matmul(a, wq, s, b, True, 64, 4, "affine")
    full = bits(f(x))
    bad = sum(int((bits(f(x[:m])) != full[:m]).sum()) for m in (1, 7, 8, 9, 16))
    assert bad > 0, "stock MLX was invariant on this sweep: the control proves nothing"


@pytest.mark.parametrize("dtype", [mx.bfloat16, mx.float16])
def test_configurations_agree_and_every_output_is_written(dtype):
    k, n = 768, 136
    wq, s, b = _weights(n, k, 4, 64, dtype)
    for m in (1, 9, 40):
        x = rand((m, k), dtype, 4)
        cfgs = [
            G.GemmConfig("skinny", mt=1, nt=1, wk=1),
            G.GemmConfig("skinny", mt=3, nt=2, wk=3),
            *[c for c in G.configs(dtype) if c.kind == "tiled"],
        ]
        first = quantized_matmul(x, wq, s, b, True, 64, 4, config=cfgs[0], poison=float("nan"))
        assert not np.isnan(f64(first)).any(), f"unwritten outputs with {cfgs[0]}"
        want = bits(first)
        for cfg in cfgs[1:]:
            got = quantized_matmul(x, wq, s, b, True, 64, 4, config=cfg, poison=float("nan"))
            assert not np.isnan(f64(got)).any(), f"unwritten outputs with {cfg}"
            assert (bits(got) == want).all(), f"{cfg} differs from {cfgs[0]} at M={m}"


@pytest.mark.parametrize("bits_", [2, 3, 4, 5, 6, 8])
def test_accuracy_against_float64_on_the_dequantised_weights(bits_):
    k, n = 2048, 256
    x = rand((16, k), mx.bfloat16, 5)
    wq, s, b = _weights(n, k, bits_, 64)
    deq = mx.dequantize(wq, s, b, group_size=64, bits=bits_)
    ref = f64(x) @ f64(deq).T
    err = lambda out: float(np.linalg.norm(f64(out) - ref) / np.linalg.norm(ref))
    ours = err(quantized_matmul(x, wq, s, b, True, 64, bits_))
    # stock beside it where it is cheap: MLX compiles each stock width for tens of seconds
    stock = (
        err(_stock.quantized_matmul(x, wq, s, b, True, 64, bits_, "affine"))
        if bits_ in (4, 8)
        else None
    )
    print(f"{bits_}-bit: ours {ours:.2e} stock {'-' if stock is None else f'{stock:.2e}'}")
    assert ours < 1e-2, f"relative error {ours:.2e} (stock {stock})"


def test_refuses_what_is_not_affine_or_transposed():
    wq, s, b = _weights(64, 128, 4, 64)
    x = rand((2, 128), mx.bfloat16)
    with pytest.raises(Unsupported, match="transpose"):
        quantized_matmul(x, wq, s, b, False, 64, 4)
    with pytest.raises(Unsupported, match="mxfp4"):
        quantized_matmul(x, wq, s, b, True, 32, 4, "mxfp4")
    with pytest.raises(Unsupported, match="dtype"):  # float32 runs (above); integers do not
        quantized_matmul(x.astype(mx.int32), wq, s, b, True, 64, 4)
    with pytest.raises(Unsupported, match="scales"):
        quantized_matmul(x, wq, s.astype(mx.float16), b, True, 64, 4)
