"""Attention's sliding window and ring storage (bi_rl.ops.scaled_dot_product_attention's
`window` and `key_start`), through the active backend: composed from stock ops on the CPU
(bi_rl.backends.composed.windowed_attention), the kernels themselves on CUDA.

Properties: the window and the ring mean what bi_rl/backends/cuda/attention.py's docstring
says (a float64 reference written from that text, not from the code under test, agrees within
the stated tolerance, on both sides of the window's edge, with masks and sinks); a row's bits
are the same from a full cache with the window argument, from a full cache with the window as
a bool mask, from a ring after several wrap-arounds, as a decode step or inside a prefill
chunk, and left-padded in a batch; bad arguments get a one-line ValueError. Guard: where
the window cuts keys, plain attention over the same cache gives other bits (the window acted).
That the kernels never read keys before a window is tested on the device
(tests/test_cuda_attention.py), since stock's composed path multiplies them by zero.
"""

from __future__ import annotations

import mlx.core as mx
import pytest
from conftest import assert_same_bits, attention_reference, bits, rand, relerr, ring_of

from bi_rl import ops
from bi_rl.backends.composed import window_mask

TOLERANCE = {mx.bfloat16: 1e-2, mx.float32: 1e-5}
sdpa = ops.scaled_dot_product_attention


@pytest.mark.parametrize("dtype", [mx.bfloat16, mx.float32])
@pytest.mark.parametrize("n", [99, 100, 101, 300])  # window - 1, window, window + 1, many
def test_window_matches_the_float64_definition(dtype, n):
    w, d = 100, 64
    q, k, v = (
        rand((2, 4, 5, d), dtype, n),
        rand((2, 2, n, d), dtype, n + 1),
        rand((2, 2, n, d), dtype, n + 2),
    )
    scale = d**-0.5
    sinks = rand((4,), dtype, 3)
    for s in (None, sinks):
        out = sdpa(q, k, v, scale, "causal", s, window=w)
        err = relerr(out, attention_reference(q, k, v, scale, window=w, sinks=s))
        assert err < TOLERANCE[dtype], f"relative error {err:.2e}, {n} keys, sinks={s is not None}"


@pytest.mark.parametrize("dtype", [mx.bfloat16, mx.float32])
def test_ring_matches_the_float64_definition_with_a_mask(dtype):
    b, n, d, w = 3, 130, 64, 50
    q, k, v = (
        rand((b, 4, 3, d), dtype, 1),
        rand((b, 2, n, d), dtype, 2),
        rand((b, 2, n, d), dtype, 3),
    )
    key_start = mx.array([0, 17, -5], mx.int32)  # -5: any int32 start, taken mod Tk
    mask = rand((b, 1, 3, n), mx.float32, 4) > -1.0  # logical positions
    out = sdpa(q, k, v, 0.125, mask, None, window=w, key_start=key_start)
    ref = attention_reference(q, k, v, 0.125, window=w, key_start=key_start, mask=mask)
    assert relerr(out, ref) < TOLERANCE[dtype]
    out = sdpa(q, k, v, 0.125, None, None, key_start=key_start)  # a ring without a window
    assert relerr(out, attention_reference(q, k, v, 0.125, key_start=key_start)) < TOLERANCE[dtype]


@pytest.mark.parametrize("dtype", [mx.bfloat16, mx.float32])
@pytest.mark.parametrize("n", [99, 100, 101, 700])
def test_full_cache_window_mask_and_ring_give_the_same_bits(dtype, n):
    w, d, scale = 100, 64, 0.125
    q = rand((1, 4, 1, d), dtype, 10)
    k, v = rand((1, 2, n, d), dtype, 11), rand((1, 2, n, d), dtype, 12)
    want = sdpa(q, k, v, scale, None, None, window=w)
    assert_same_bits(sdpa(q, k, v, scale, "causal", None, window=w), want, "window with 'causal'")
    assert_same_bits(sdpa(q, k, v, scale, window_mask(1, n, w)), want, "window as a bool mask")
    for cap in (w, w + 37):
        if cap <= n:
            rk, ks = ring_of(k, cap)
            rv, _ = ring_of(v, cap)
            got = sdpa(q, rk, rv, scale, None, None, window=w, key_start=ks)
            assert_same_bits(got, want, f"ring of {cap} after {n // cap} wraps")
    if n > w:  # the window really cut keys: plain attention over the cache differs
        assert (bits(sdpa(q, k, v, scale)) != bits(want)).any()


@pytest.mark.parametrize("dtype", [mx.bfloat16, mx.float32])
def test_window_decode_chunks_and_full_prefill_give_the_same_bits(dtype):
    n, w, d, scale = 400, 100, 64, 0.125
    q = rand((1, 4, n, d), dtype, 20)
    k, v = rand((1, 2, n, d), dtype, 21), rand((1, 2, n, d), dtype, 22)
    full = sdpa(q, k, v, scale, "causal", None, window=w)
    assert_same_bits(
        sdpa(q, k, v, scale, window_mask(n, n, w)), full, "full prefill, window as a mask"
    )
    for c in (1, 8, 9):
        got = sdpa(q[:, :, n - c :], k, v, scale, "causal", None, window=w)
        assert_same_bits(got, full[:, :, n - c :], f"chunk of {c}")
    # the same chunk read from a ring that holds just enough keys (capacity w + c - 1)
    c, cap = 9, w + 8
    rk, ks = ring_of(k, cap)
    rv, _ = ring_of(v, cap)
    got = sdpa(q[:, :, n - c :], rk, rv, scale, "causal", None, window=w, key_start=ks)
    assert_same_bits(got, full[:, :, n - c :], "chunk of 9 from a ring")


def test_window_with_left_padding_and_sinks_in_a_batch():
    dtype, w, d, scale = mx.bfloat16, 64, 64, 0.125
    n, pad = 200, 37
    q = rand((1, 4, 1, d), dtype, 30)
    k, v = rand((1, 2, n, d), dtype, 31), rand((1, 2, n, d), dtype, 32)
    sinks = rand((4,), dtype, 33)
    alone = sdpa(q, k, v, scale, None, sinks, window=w)
    junk_k, junk_v = rand((1, 2, pad, d), dtype, 34), rand((1, 2, pad, d), dtype, 35)
    other = [rand((1, 2, n + pad, d), dtype, 36 + i) for i in range(2)]
    kb = mx.concatenate([other[0], mx.concatenate([junk_k, k], axis=2)])
    vb = mx.concatenate([other[1], mx.concatenate([junk_v, v], axis=2)])
    qb = mx.concatenate([rand((1, 4, 1, d), dtype, 38), q])
    valid = mx.arange(n + pad)[None, :] >= mx.array([[0], [pad]])  # row 1 left-padded by pad
    out = sdpa(qb, kb, vb, scale, valid[:, None, None, :], sinks, window=w)
    assert_same_bits(out[1:], alone, "left-padded row in a batch of 2")


def test_bad_window_arguments_are_refused():
    q, k, v = rand((2, 2, 1, 64), mx.bfloat16, 0), rand((2, 2, 8, 64), mx.bfloat16, 1), None
    v = k
    for window in (0, -3, 2.5, True):
        with pytest.raises(ValueError, match="window must be a positive int"):
            sdpa(q, k, v, 0.1, window=window)
    with pytest.raises(ValueError, match=r"key_start must have shape \(2,\)"):
        sdpa(q, k, v, 0.1, key_start=mx.array([1, 2, 3], mx.int32))
    with pytest.raises(ValueError, match="key_start must be an integer"):
        sdpa(q, k, v, 0.1, key_start=mx.array([1.0, 2.0]))
