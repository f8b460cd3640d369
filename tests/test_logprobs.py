"""bi_rl.logprobs: float32 logprobs and exact, order-independent row fingerprints.

Properties: MLX's uint32 arithmetic wraps like C (the hashes depend on it); logprobs match a
float64 reference; a row's logprob and fingerprint bits do not depend on the other rows;
fingerprints equal a NumPy reference computed in another summation order and change with
any single bit of any logit.
"""

import mlx.core as mx
import numpy as np
import pytest

from bi_rl.logprobs import (
    fingerprint_ints,
    fmix32,
    fmix32_np,
    logit_bits,
    logprob_temperature,
    row_fingerprints,
    row_fingerprints_np,
    token_logprobs,
)

RNG = np.random.default_rng(1234)


def _u32(n):
    return RNG.integers(0, 2**32, size=n, dtype=np.uint64).astype(np.uint32)


def test_uint32_ops_wrap_like_c():
    a, b = _u32(4096), _u32(4096)
    ma, mb = mx.array(a), mx.array(b)
    wide_a, wide_b = a.astype(np.uint64), b.astype(np.uint64)
    mask = np.uint64(0xFFFFFFFF)
    assert (ma * mb).dtype == mx.uint32
    assert (np.array(ma * mb) == ((wide_a * wide_b) & mask).astype(np.uint32)).all()
    assert (np.array(ma + mb) == ((wide_a + wide_b) & mask).astype(np.uint32)).all()
    for s in (1, 9, 13, 16, 31):
        assert (np.array(ma >> s) == (a >> np.uint32(s))).all()
        assert (np.array(ma << s) == ((wide_a << np.uint64(s)) & mask).astype(np.uint32)).all()
    assert (np.array(ma ^ mb) == (a ^ b)).all()


def test_uint32_sum_stays_uint32_and_wraps():
    x = mx.full((3, 1001), 0xFFFFFFFF, dtype=mx.uint32)
    s = mx.sum(x, axis=-1)
    assert s.dtype == mx.uint32
    assert np.array(s).tolist() == [(1001 * 0xFFFFFFFF) % 2**32] * 3


def test_fmix32_matches_numpy():
    x = _u32(10000)
    assert (np.array(fmix32(mx.array(x))) == fmix32_np(x)).all()
    # a bijection: distinct inputs stay distinct
    assert len(np.unique(fmix32_np(np.arange(100000, dtype=np.uint32)))) == 100000


@pytest.mark.parametrize("temperature", [0.0, 1.0, 0.7, 1.3])
def test_logprobs_match_float64_reference(temperature):
    logits = mx.array(RNG.normal(size=(5, 3, 301)).astype(np.float32) * 4)
    tokens = mx.array(RNG.integers(0, 301, size=(5, 3)))
    got = np.array(token_logprobs(logits, tokens, temperature))
    assert got.dtype == np.float32
    t = np.float32(logprob_temperature(temperature))
    x = (np.array(logits) / t).astype(np.float64)
    ref = (
        x
        - np.log(np.exp(x - x.max(-1, keepdims=True)).sum(-1, keepdims=True))
        - x.max(-1, keepdims=True)
    )
    ref = np.take_along_axis(ref, np.array(tokens)[..., None], axis=-1)[..., 0]
    np.testing.assert_allclose(got, ref, rtol=0, atol=2e-6 * max(1, np.abs(ref).max()))


def test_greedy_logprobs_are_temperature_one():
    logits = mx.array(RNG.normal(size=(2, 50)).astype(np.float32))
    tokens = mx.array([3, 7])
    a = np.array(token_logprobs(logits, tokens, 0.0)).view(np.uint32)
    b = np.array(token_logprobs(logits, tokens, 1.0)).view(np.uint32)
    assert (a == b).all()
    with pytest.raises(ValueError):
        logprob_temperature(-1)


@pytest.mark.parametrize("dtype", [mx.float32, mx.bfloat16, mx.float16])
def test_row_alone_equals_row_in_batch(dtype):
    """A row's logprob and fingerprint bits are the same alone and among 1..64 other rows."""
    vocab = 1003  # not a multiple of any SIMD width: tails land mid-row in the batch
    big = mx.array(RNG.normal(size=(64, vocab)).astype(np.float32) * 3).astype(dtype)
    tokens = mx.array(RNG.integers(0, vocab, size=64))
    batch_lp = np.array(token_logprobs(big, tokens, 0.8)).view(np.uint32)
    batch_fp = np.array(row_fingerprints(big))
    for b in (1, 7, 8, 9, 64):
        lp = np.array(token_logprobs(big[:b], tokens[:b], 0.8)).view(np.uint32)
        fp = np.array(row_fingerprints(big[:b]))
        assert (lp == batch_lp[:b]).all() and (fp == batch_fp[:b]).all()
    for r in (0, 5, 63):
        lp = np.array(token_logprobs(big[r : r + 1], tokens[r : r + 1], 0.8)).view(np.uint32)
        assert lp[0] == batch_lp[r]
        assert (np.array(row_fingerprints(big[r])) == batch_fp[r]).all()


@pytest.mark.parametrize("dtype", [mx.float32, mx.bfloat16, mx.float16])
def test_fingerprint_equals_reference_in_another_order(dtype):
    logits = mx.array(RNG.normal(size=(4, 777)).astype(np.float32)).astype(dtype)
    got = np.array(row_fingerprints(logits))
    bits = np.array(logit_bits(logits))
    assert (got == row_fingerprints_np(bits)).all()
    # The same digest summed back to front, in uneven chunks: integer sums do not care.
    from bi_rl.logprobs import FINGERPRINT_LANES, _index_hash_np

    idx = _index_hash_np(777)
    for lane in range(len(FINGERPRINT_LANES)):
        terms = fmix32_np(bits ^ idx[lane]).astype(np.uint64)
        acc = np.zeros(4, dtype=np.uint64)
        for lo in range(777, 0, -50):
            acc = (acc + terms[:, max(0, lo - 50) : lo].sum(axis=-1)) & np.uint64(0xFFFFFFFF)
        assert (acc.astype(np.uint32) == got[:, lane]).all()


def test_fingerprint_sees_every_bit_and_position():
    row = RNG.normal(size=(1, 256)).astype(np.float32)
    base = fingerprint_ints(row_fingerprints(mx.array(row)))[0]
    seen = {base}
    for v in (0, 1, 100, 255):
        for bit in (0, 1, 22, 23, 31):
            flipped = row.copy().view(np.uint32)
            flipped[0, v] ^= np.uint32(1 << bit)
            fp = fingerprint_ints(row_fingerprints(mx.array(flipped.view(np.float32))))[0]
            assert fp != base, (v, bit)
            seen.add(fp)
    swapped = row.copy()
    swapped[0, [3, 4]] = swapped[0, [4, 3]]
    assert fingerprint_ints(row_fingerprints(mx.array(swapped)))[0] != base
    assert len(seen) == 21


def test_fingerprint_ints_pack_two_lanes():
    lanes = np.array([[1, 2], [0xFFFFFFFF, 0xFFFFFFFF]], dtype=np.uint32)
    assert fingerprint_ints(lanes) == [(2 << 32) | 1, 2**64 - 1]


def test_unfingerprintable_dtype_is_refused():
    with pytest.raises(TypeError, match="dtype"):
        row_fingerprints(mx.array([[1, 2]], dtype=mx.int32))
