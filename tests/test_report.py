"""bi_rl.score.report: equality on bits, KL estimators in the stated direction.

Properties: equal bit patterns give zero differing tokens and k1 = k2 = k3 = 0 exactly
(not approximately), ratios exactly 1; a single flipped bit is counted and located (sample,
position, both values and bit patterns); -0.0 vs +0.0 counts as different bits; k1, k2,
k3 and r match their definitions (p = rollout, q = rescored, tokens sampled from p) computed
independently in float64; a fingerprint mismatch alone makes a report non-identical; the
verl / TRL aliases carry the same numbers; mismatched shapes are refused.
"""

import math

import numpy as np
import pytest

from bi_rl.score.report import compare, format_table, kl_estimators


def _bits(x):
    return np.asarray(x, dtype=np.float32).view(np.uint32)


def _samples():
    rng = np.random.default_rng(0)
    return [_bits(-rng.exponential(2.0, size=n)) for n in (5, 1, 12, 7)]


def test_equal_bits_give_exact_zeros():
    a = _samples()
    r = compare(
        a,
        [x.copy() for x in a],
        rollout_fingerprints=[[1] * len(x) for x in a],
        rescored_fingerprints=[[1] * len(x) for x in a],
    )
    assert r.identical and r.differing == 0 and r.tokens == r.equal == 25
    assert r.first_divergence is None and r.first_fingerprint_divergence is None
    for v in (r.k1_mean, r.k1_max, r.k2_mean, r.k2_max, r.k3_mean, r.k3_max, r.max_abs_diff):
        assert v == 0.0 and math.copysign(1.0, v) == 1.0, "KL must be exactly +0"
    assert r.ratio_min == r.ratio_mean == r.ratio_max == 1.0
    assert "0 / 0" in format_table(r)


def test_one_flipped_bit_is_counted_and_located():
    a = _samples()
    b = [x.copy() for x in a]
    b[2][7] ^= 1  # one ulp
    r = compare(a, b, tokens=[list(range(len(x))) for x in a], labels=["s0", "s1", "s2", "s3"])
    assert not r.identical and r.differing == 1 and r.samples_differing == 1
    d = r.first_divergence
    assert (d.sample, d.position, d.label, d.token) == (2, 7, "s2", 7)
    assert (d.rollout_bits, d.rescored_bits) == (int(a[2][7]), int(b[2][7]))
    assert d.rollout_logprob == float(a[2][7:8].view(np.float32)[0])
    assert d.rescored_logprob == float(b[2][7:8].view(np.float32)[0])
    assert r.max_abs_diff > 0 and r.k3_max > 0
    assert "s2, position 7" in format_table(r)


def test_signed_zero_counts_as_a_difference():
    r = compare([_bits([0.0])], [_bits([-0.0])])
    assert r.differing == 1, "bit patterns, not float ==, decide equality"
    assert r.k1_max == 0.0  # the values are equal, the bits are not


def test_estimators_match_their_definitions():
    log_p = np.array([-0.1, -2.0, -5.0, -0.7], dtype=np.float32)
    log_q = np.array([-0.2, -1.5, -5.0, -3.0], dtype=np.float32)
    r = compare([_bits(log_p)], [_bits(log_q)])
    lp, lq = log_p.astype(np.float64), log_q.astype(np.float64)
    k1 = lp - lq
    k2 = 0.5 * (lp - lq) ** 2
    ratio = np.exp(lq) / np.exp(lp)  # r = q / p
    k3 = (ratio - 1) - np.log(ratio)
    assert r.k1_mean == pytest.approx(k1.mean(), rel=1e-12)
    assert r.k1_max == pytest.approx(k1.max(), rel=1e-12)
    assert r.k2_mean == pytest.approx(k2.mean(), rel=1e-12)
    assert r.k3_mean == pytest.approx(k3.mean(), rel=1e-9)
    assert r.k3_max == pytest.approx(k3.max(), rel=1e-9)
    assert r.ratio_max == pytest.approx(ratio.max(), rel=1e-12)
    assert r.max_abs_diff == pytest.approx(np.abs(k1).max(), rel=1e-12)
    assert r.prob_diff_max == pytest.approx(np.abs(np.exp(lp) - np.exp(lq)).max(), rel=1e-12)
    # Direction: the rescorer giving a sampled token less mass (q < p) makes k1 positive.
    est = kl_estimators(np.array([-1.0]), np.array([-2.0]))
    assert est["k1"][0] == 1.0 and est["ratio"][0] == pytest.approx(math.exp(-1.0))
    assert (est["k2"] >= 0).all() and (est["k3"] >= 0).all()


def test_fingerprint_mismatch_alone_is_not_identical():
    a = _samples()
    fa = [[i * 10 + j for j in range(len(x))] for i, x in enumerate(a)]
    fb = [list(f) for f in fa]
    fb[3][4] += 1
    r = compare(a, [x.copy() for x in a], rollout_fingerprints=fa, rescored_fingerprints=fb)
    assert r.differing == 0 and not r.identical
    assert r.fingerprints_equal == r.fingerprints_compared - 1
    d = r.first_fingerprint_divergence
    assert (d.sample, d.position, d.rollout_fingerprint, d.rescored_fingerprint) == (3, 4, 34, 35)
    assert "fingerprint" in format_table(r)


def test_aliases_carry_the_same_numbers():
    r = compare([_bits([-1.0, -2.0])], [_bits([-1.5, -2.0])])
    al = r.aliases()
    assert al["rollout_corr/kl"] == r.k1_mean and al["rollout_corr/k3_kl"] == r.k3_mean
    assert al["sampling/sampling_logp_difference/max"] == r.max_abs_diff == 0.5
    assert al["sampling/importance_sampling_ratio/min"] == r.ratio_min
    js = r.to_json()
    assert js["identical"] is False and "KL(rollout || rescored)" in js["direction"]


def test_mismatched_shapes_are_refused():
    with pytest.raises(ValueError, match="2 rollout samples vs 1"):
        compare([_bits([0.0]), _bits([0.0])], [_bits([0.0])])
    with pytest.raises(ValueError, match="3 logged tokens vs 2"):
        compare([_bits([0.0, 0.0, 0.0])], [_bits([0.0, 0.0])])
