"""bi_rl.rollout.sampler: keyed, per-row sampling.

Properties: the noise for (seed, sequence, position, token) is a pure function of them, the
same in any batch; uniforms never reach 0 or 1; a row's token is the same alone, in a batch
of 64 and in any order; the draws follow softmax(logits / T) restricted to what the filters
keep; greedy and the filters break ties deterministically.
"""

import hashlib
import math
import struct

import mlx.core as mx
import numpy as np
import pytest

from bi_rl.logprobs import scaled_logits
from bi_rl.rollout.sampler import (
    SamplerConfig,
    bits_to_uniform,
    filter_mask,
    first_argmax,
    gumbel_noise,
    row_key,
    row_keys,
    sample,
    sample_scaled,
    sequence_id,
    uniform_noise,
)

RNG = np.random.default_rng(7)


def test_uniform_is_strictly_inside_the_unit_interval():
    extremes = mx.array([0, 1, 511, 512, 2**31, 2**32 - 1], dtype=mx.uint32)
    u = np.array(bits_to_uniform(extremes))
    assert u[0] == 2.0**-24 and u[-1] == 1 - 2.0**-24
    assert (u > 0).all() and (u < 1).all()
    g = np.array(-mx.log(-mx.log(bits_to_uniform(extremes))))
    assert np.isfinite(g).all()
    # every value is an odd multiple of 2^-24, exactly representable
    k = (u.astype(np.float64) * 2**24).round()
    assert ((k % 2) == 1).all() and (k * 2.0**-24 == u).all()


@pytest.mark.parametrize("rows,vocab", [(1, 1), (3, 17), (37, 1001), (5, 151936)])
def test_fused_uniform_noise_equals_its_definition(rows, vocab):
    """The compiled noise (one fused pass on the device) is the documented integer hash, bit
    for bit: the host reimplementation in NumPy agrees at every element."""
    from bi_rl.logprobs import fmix32_np

    keys = row_keys(11, [(sequence_id("p", r), r * 7) for r in range(rows)])
    got = np.array(uniform_noise(keys, vocab)).view(np.uint32)
    k = np.array(keys).astype(np.uint32)
    with np.errstate(over="ignore"):
        v = np.arange(vocab, dtype=np.uint32)[None, :] * np.uint32(0x9E3779B9)
        x = fmix32_np(fmix32_np(fmix32_np(v + k[:, :1]) ^ k[:, 1:]) + k[:, :1])
    want = (((x >> np.uint32(9)).astype(np.float32) * 2 + 1) * np.float32(2.0**-24)).view(np.uint32)
    assert np.array_equal(got, want)


def test_uniform_noise_is_roughly_uniform_and_distinct_within_a_row():
    keys = row_keys(3, [(sequence_id("p", 0), t) for t in range(8)])
    u = np.array(uniform_noise(keys, 5000))
    assert abs(u.mean() - 0.5) < 0.01 and abs(u.var() - 1 / 12) < 0.005
    assert all(len(np.unique(r)) > 4990 for r in u)  # a bijection of v before truncation


def test_noise_depends_only_on_its_key():
    """A row's noise is the same computed alone or among other rows, in any order."""
    rows = [(sequence_id(f"p{i}", s), t) for i in range(5) for s in range(3) for t in (0, 9)]
    keys = row_keys(11, rows)
    together = np.array(gumbel_noise(keys, 1001)).view(np.uint32)
    perm = RNG.permutation(len(rows))
    shuffled = np.array(gumbel_noise(keys[mx.array(perm)], 1001)).view(np.uint32)
    assert (shuffled == together[perm]).all()
    alone = np.array(gumbel_noise(keys[4:5], 1001)).view(np.uint32)
    assert (alone[0] == together[4]).all()


def test_row_keys_are_row_key_of_every_row():
    """row_key and its batched form (both hashing from a cached per-sequence state) give the
    documented key, blake2b-64 of (seed, sequence id, position), also for NumPy integers and
    repeated calls, and refuse what is out of range."""
    rows = [(sequence_id(f"p{i}", s), t) for i in range(7) for s in range(2) for t in (0, 1, 2**63)]
    rows.append((np.uint64(2**64 - 1), np.int64(5)))

    def defined(s, t):
        data = struct.pack("<QQQ", 9, int(s), int(t))
        d = hashlib.blake2b(data, digest_size=8, person=b"bi-rl/key").digest()
        return int.from_bytes(d[:4], "little"), int.from_bytes(d[4:], "little")

    want = np.array([defined(s, t) for s, t in rows], dtype=np.uint32)
    assert [row_key(9, s, t) for s, t in rows] == [defined(s, t) for s, t in rows]
    for _ in range(2):  # the second call reuses the cached states
        got = np.array(row_keys(9, rows))
        assert got.dtype == np.uint32 and np.array_equal(got, want)
    assert np.array(row_keys(9, [])).shape == (0, 2)
    for bad in ([(0, -1)], [(-1, 0)], [(2**64, 0)], [(0, 2**64)]):
        with pytest.raises(ValueError):
            row_keys(9, bad)
    with pytest.raises(ValueError):
        row_keys(-1, [(0, 0)])


def test_keys_change_with_every_input():
    base = row_key(0, sequence_id("a", 0), 0)
    variants = {
        row_key(1, sequence_id("a", 0), 0),
        row_key(0, sequence_id("a", 1), 0),
        row_key(0, sequence_id("b", 0), 0),
        row_key(0, sequence_id("a", 0), 1),
    }
    assert base not in variants and len(variants) == 4
    assert sequence_id("a", 0) == sequence_id("a", 0)
    with pytest.raises(ValueError):
        row_key(-1, 0, 0)


@pytest.mark.parametrize(
    "cfg",
    [
        SamplerConfig(temperature=1.0),
        SamplerConfig(temperature=0.7, top_k=20),
        SamplerConfig(temperature=1.2, top_p=0.8),
        SamplerConfig(temperature=1.0, min_p=0.05),
        SamplerConfig(temperature=0.0),
    ],
)
def test_row_token_same_alone_and_in_a_shuffled_batch_of_64(cfg):
    vocab = 997
    logits = mx.array(RNG.normal(size=(64, vocab)).astype(np.float32) * 2).astype(mx.bfloat16)
    keys = row_keys(5, [(sequence_id(str(i), 0), i % 7) for i in range(64)])
    batch = np.array(sample(logits, keys, cfg))
    perm = mx.array(RNG.permutation(64))
    assert (np.array(sample(logits[perm], keys[perm], cfg)) == batch[np.array(perm)]).all()
    for r in (0, 7, 8, 63):
        assert int(sample(logits[r : r + 1], keys[r : r + 1], cfg)[0]) == batch[r]
    for b in (7, 8, 9):
        assert (np.array(sample(logits[:b], keys[:b], cfg)) == batch[:b]).all()
    if cfg.temperature > 0:  # guard: the draws are not just the argmax
        assert (batch != np.array(first_argmax(logits.astype(mx.float32)))).any()


@pytest.mark.parametrize("dtype", [mx.float32, mx.float16, mx.bfloat16])
def test_sample_is_the_first_argmax_of_logits_plus_gumbel_noise(dtype):
    """The sampler forms x - log(-log(u)) where the definition reads x + gumbel_noise
    (-log(-log(u))): the same bits (IEEE a - b is a + (-b)), so the same tokens, including
    rows of ties, infinities and NaN; sample_scaled on shared scaled logits is sample."""
    vocab = 1000
    raw = RNG.normal(size=(32, vocab)).astype(np.float32) * 3
    raw[1] = 0.5  # every logit tied
    raw[2, ::7] = -np.inf
    raw[3, 5] = np.inf
    raw[4, 9] = np.nan
    logits = mx.array(raw).astype(dtype)
    keys = row_keys(3, [(sequence_id(str(i), 0), i) for i in range(32)])
    for cfg in (SamplerConfig(temperature=0.7), SamplerConfig(temperature=1.0, top_k=5)):
        x = scaled_logits(logits, cfg.temperature)
        u = uniform_noise(keys, vocab)
        by_difference = x - mx.log(-mx.log(u))
        by_definition = x + gumbel_noise(keys, vocab)
        finite = np.isfinite(np.array(by_definition))
        assert finite.sum() > 0.9 * finite.size, "guard: the rows are mostly finite"
        np.testing.assert_array_equal(
            np.array(by_difference).view(np.uint32)[finite],
            np.array(by_definition).view(np.uint32)[finite],
        )
        assert (np.isnan(np.array(by_difference)) == np.isnan(np.array(by_definition))).all()
        keep = filter_mask(x, cfg)
        z = by_definition if keep is None else mx.where(keep, by_definition, -math.inf)
        tokens = np.array(sample(logits, keys, cfg))
        np.testing.assert_array_equal(tokens, np.array(first_argmax(z)))
        np.testing.assert_array_equal(tokens, np.array(sample_scaled(x, keys, cfg)))
        assert (tokens != np.array(first_argmax(x))).any(), "guard: draws are not the argmax"


def _frequencies(logits_row, cfg, n=20000, seed=0):
    logits = mx.broadcast_to(mx.array(logits_row, dtype=mx.float32)[None], (n, len(logits_row)))
    keys = row_keys(seed, [(sequence_id("freq", i), 0) for i in range(n)])
    tokens = np.array(sample(logits, keys, cfg))
    return np.bincount(tokens, minlength=len(logits_row)) / n


def _softmax(x):
    e = np.exp(x - x.max())
    return e / e.sum()


@pytest.mark.parametrize("temperature", [1.0, 0.5])
def test_draws_follow_the_softmax(temperature):
    row = np.array([2.0, 1.0, 0.5, 0.0, -1.0, -3.0])
    p = _softmax(row / temperature)
    f = _frequencies(row, SamplerConfig(temperature=temperature))
    sigma = np.sqrt(p * (1 - p) / 20000)
    assert (np.abs(f - p) < 5 * sigma + 1e-4).all(), (f, p)


def test_filters_restrict_and_renormalise():
    row = np.array([2.0, 1.5, 1.0, 0.5, 0.0, -0.5])
    p = _softmax(row)
    f = _frequencies(row, SamplerConfig(top_k=2))
    assert f[2:].sum() == 0
    assert abs(f[0] - p[0] / p[:2].sum()) < 0.02
    # p = .414 .251 .152 .092 ...: mass above each = 0 .414 .665 .817 ...
    f = _frequencies(row, SamplerConfig(top_p=0.6))
    assert f[2:].sum() == 0 and (f[:2] > 0).all()
    f = _frequencies(row, SamplerConfig(top_p=0.7))
    assert f[3:].sum() == 0 and (f[:3] > 0).all()
    f = _frequencies(row, SamplerConfig(min_p=0.3))  # keeps p >= .3 p_max: first 3
    assert f[3:].sum() == 0 and (f[:3] > 0).all()


def test_filter_ties_are_kept_whole():
    x = mx.array([[3.0, 1.0, 3.0, 2.0, 2.0, 0.0]])
    assert np.array(filter_mask(x, SamplerConfig(top_k=1))).tolist() == [
        [True, False, True, False, False, False]
    ]
    assert np.array(filter_mask(x, SamplerConfig(top_k=3))).tolist() == [
        [True, False, True, True, True, False]
    ]
    # top-p: the two tied maxima hold > 0.5 together; both stay, nothing else
    mask = np.array(filter_mask(x, SamplerConfig(top_p=0.4)))[0]
    assert mask.tolist() == [True, False, True, False, False, False]
    # the most probable token survives even a tiny top_p
    assert np.array(filter_mask(x, SamplerConfig(top_p=1e-6)))[0, 0]
    assert filter_mask(x, SamplerConfig()) is None


def test_min_p_threshold_is_exact_in_logit_space():
    x = mx.array([[0.0, math.log(0.5), math.log(0.5) - 1e-3, -10.0]], dtype=mx.float32)
    mask = np.array(filter_mask(x, SamplerConfig(min_p=0.5)))[0]
    assert mask.tolist() == [True, True, False, False]


def test_greedy_takes_the_first_maximum():
    x = mx.array([[1.0, 5.0, 5.0, 2.0], [7.0, 7.0, 7.0, 7.0]])
    keys = row_keys(0, [(1, 0), (2, 0)])
    assert np.array(sample(x, keys, SamplerConfig(temperature=0))).tolist() == [1, 0]
    nan_row = mx.array([[math.nan, math.nan]])
    assert int(first_argmax(nan_row)[0]) == 2  # "no maximum": the engine refuses it


@pytest.mark.parametrize(
    "kwargs",
    [
        {"temperature": -0.1},
        {"temperature": math.inf},
        {"top_p": 0.0},
        {"top_p": 1.5},
        {"top_k": -1},
        {"min_p": 1.0},
        {"seed": -1},
        {"seed": 2**64},
        {"seed": 1.5},
    ],
)
def test_bad_settings_are_refused(kwargs):
    with pytest.raises(ValueError):
        SamplerConfig(**kwargs)


def test_the_seed_range_is_checked_on_construction():
    """A Python caller's bad seed fails where the config is made, not inside a later draw;
    both ends of [0, 2^64) are accepted and every key they make is valid."""
    for seed in (0, 2**64 - 1):
        assert row_key(SamplerConfig(seed=seed).seed, 1, 2)
    for seed in (-1, 2**64):
        with pytest.raises(ValueError, match=r"seed must be an integer in \[0, 2\^64\)"):
            SamplerConfig(seed=seed)
