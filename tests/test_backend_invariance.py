"""The active backend's invariant ops (the CPU's in CI, CUDA's on a GPU machine): invariant on
both sides of every threshold, accurate against float64, strict about what it has not proven."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from conftest import f64, rand, relerr

import bi_rl
from bi_rl.verify import MODE
from bi_rl.verify.attention import attention_check
from bi_rl.verify.gemm import gemm_check, quantized_check

DTYPES = {"float32": mx.float32, "float16": mx.float16, "bfloat16": mx.bfloat16}
# Relative Frobenius error vs float64 allowed for each operand dtype.
TOLERANCE = {"float32": 1e-6, "float16": 2e-3, "bfloat16": 1e-2}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", ["linear", "linear+bias", "matmul x@W.T", "addmm"])
def test_gemm_rows_are_invariant_across_batch_7_8_9_and_odd_shapes(dtype, layout):
    check = gemm_check(MODE, layout, dtype, DTYPES[dtype], 127, 65, (1, 7, 8, 9, 256, 257), 1)
    assert check.status == "ok", check.where
    assert check.compared > 0


@pytest.mark.parametrize("bits", [2, 3, 4, 5, 6, 8])
@pytest.mark.parametrize("group", [32, 64, 128])
def test_quantized_rows_are_invariant(bits, group):
    check = quantized_check(MODE, "bfloat16", mx.bfloat16, 384, 48, bits, group, (1, 7, 8, 9), 2)
    assert check.status == "ok", check.where


@pytest.mark.parametrize("keys", [255, 256, 257, 4095, 4096, 4097])
def test_attention_decode_chunks_padding_and_grown_cache_agree(keys):
    check = attention_check(
        MODE, "bfloat16", mx.bfloat16, keys, (1, 8, 9), 64, 4, 2, (0, 300), 3, 9
    )
    assert check.status == "ok", check.where
    assert check.compared > 0


@pytest.mark.parametrize("head_dim", [64, 80, 96, 128])
def test_attention_head_dims_and_full_prefill_reference(head_dim):
    check = attention_check(
        MODE, "float32", mx.float32, 65, (1, 8, 9, 32), head_dim, 14, 2, (0, 7), 4, 65
    )
    assert check.status == "ok", check.where


@pytest.mark.parametrize("dtype", DTYPES)
def test_linear_and_attention_accuracy_against_float64(dtype):
    x, w, b = (
        rand((33, 257), DTYPES[dtype]),
        rand((65, 257), DTYPES[dtype], 1),
        rand((65,), DTYPES[dtype], 2),
    )
    ref = f64(x) @ f64(w).T + f64(b)
    assert relerr(bi_rl.linear(x, w, b), ref) < TOLERANCE[dtype]

    q, k, v = (rand((1, 2, 9, 64), DTYPES[dtype], s) for s in (3, 4, 5))
    s = np.einsum("hqd,hkd->hqk", f64(q)[0], f64(k)[0]) / 8.0
    s = s + np.triu(np.full((9, 9), -np.inf), 1)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    ref = np.einsum("hqk,hkd->hqd", p, f64(v)[0])[None]
    out = bi_rl.scaled_dot_product_attention(q, k, v, 1 / 8.0, "causal")
    assert relerr(out, ref) < max(TOLERANCE[dtype], 1e-5)


def test_refuses_what_it_has_not_proven():
    name = bi_rl.active_backend().name
    x = mx.ones((2, 4), dtype=mx.int32)
    with pytest.raises(NotImplementedError, match=f"matmul on the {name} backend.*int32"):
        bi_rl.matmul(x, x.T)
    w = rand((32, 64))
    wq, s, bq = mx.quantize(w, group_size=32, bits=4, mode="affine")
    with pytest.raises(NotImplementedError, match="mode=mxfp4"):
        bi_rl.quantized_matmul(rand((2, 64)), wq, s, bq, True, 32, 4, "mxfp4")
