"""The active backend's invariant ops (the CPU's in CI, CUDA's on a GPU machine): invariant on
both sides of every threshold, accurate against float64, strict about what it has not proven."""

from __future__ import annotations

import collections
from dataclasses import replace

import mlx.core as mx
import numpy as np
import pytest
from conftest import assert_same_bits, f64, rand, relerr

import bi_rl
from bi_rl import _stock, backends
from bi_rl.backends import Backend, Unsupported
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


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows", [1, 7, 8, 9, 257])
def test_grouped_linear_gives_each_weight_the_bits_of_its_own_linear(dtype, rows):
    """The backend contract: output i of grouped_linear(x, ws) is linear(x, ws[i]), bit for
    bit, for widths that do not divide each other (q/k/v of unequal sizes)."""
    x = rand((rows, 257), DTYPES[dtype])
    ws = [rand((n, 257), DTYPES[dtype], key) for key, n in enumerate((127, 65, 65), 1)]
    outs = bi_rl.ops.grouped_linear(x, ws)
    assert len(outs) == len(ws)
    for i, (out, w) in enumerate(zip(outs, ws, strict=True)):
        assert_same_bits(out, bi_rl.linear(x, w), f"member {i} of {len(ws)}")
    x3 = rand((2, rows, 257), DTYPES[dtype], 9)  # a batch of sequences, as a model passes it
    for out, w in zip(bi_rl.ops.grouped_linear(x3, ws), ws, strict=True):
        assert_same_bits(out, bi_rl.linear(x3, w), "a 3-D activation")


def test_grouped_linear_without_a_backend_op_runs_one_linear_per_weight():
    """A backend with no grouped_linear, or weights grouped_linear does not take (another
    dtype: promoted as linear promotes), get separate invariant linears, not a refusal."""
    base = bi_rl.active_backend()
    calls = collections.Counter()

    def counted(name):
        def impl(*args):
            calls[name] += 1
            return base.ops[name](*args)

        return impl

    without = Backend(base.name, {"linear": counted("linear")})
    x, ws = rand((5, 64)), [rand((32, 64), key=1), rand((16, 64), key=2)]
    with backends.use(without):
        outs = bi_rl.ops.grouped_linear(x, ws)
    assert calls == {"linear": 2}
    for out, w in zip(outs, ws, strict=True):
        assert_same_bits(out, bi_rl.linear(x, w), "separate linears")

    with_op = Backend(
        base.name, {"linear": counted("linear"), "grouped_linear": counted("grouped")}
    )
    calls.clear()
    mixed = [ws[0], ws[1].astype(mx.bfloat16)]
    with backends.use(with_op):
        outs = bi_rl.ops.grouped_linear(x, mixed)
    assert calls == {"linear": 2}, "a weight of another dtype must not reach grouped_linear"
    assert outs[1].dtype == mx.float32
    assert_same_bits(outs[1], bi_rl.linear(x, mixed[1]), "promoted member")
    with pytest.raises(ValueError, match="at least one weight"):
        bi_rl.ops.grouped_linear(x, [])


def test_grouped_linear_refusal_is_strict_and_names_the_op():
    def refuse(x, ws):
        raise Unsupported("no grouped kernel for this shape")

    base = bi_rl.active_backend()
    refusing = replace(base, ops={**base.ops, "grouped_linear": refuse})
    x, ws = rand((3, 64)), [rand((32, 64), key=1), rand((16, 64), key=2)]
    with backends.use(refusing):
        with pytest.raises(NotImplementedError, match="grouped_linear on the .*grouped kernel"):
            bi_rl.ops.grouped_linear(x, ws)
        bi_rl.ops._warned.discard((base.name, "grouped_linear"))
        with bi_rl.batch_invariant_mode(strict=False), pytest.warns(bi_rl.BatchVariantWarning):
            outs = bi_rl.ops.grouped_linear(x, ws)
    for out, w in zip(outs, ws, strict=True):
        assert_same_bits(out, _stock.linear(x, w), "lax fallback to stock")
