"""Attention checks: a query row's output vs the same row in a different computation.

Reference: the last `ref_q` query rows of one sequence computed in one causal prefill call
over its exact keys. Each query tail of length q (1 = decode, 8/9, up to 32) must carry the
reference's bits when computed as its own chunk, under every mask form (None for decode,
"causal", bool, additive), behind a cache grown by masked keys appended after the row, and
left-padded inside a batch of other sequences of other lengths.

Sliding windows (`window_check`): the reference is the last rows of a full-sequence prefill
with the window argument; each tail must carry its bits with the window given as an argument,
as a bool mask, read from a ring (rotating cache) after several wrap-arounds, and left-padded
in a batch.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from bi_rl.backends.composed import window_mask
from bi_rl.verify.core import Check, bits, rand


def causal_bool(q: int, keys: int, valid_from: int = 0, valid_to: int | None = None) -> mx.array:
    """Lower-right causal bool mask (q, keys) over keys [valid_from, valid_to)."""
    valid_to = keys if valid_to is None else valid_to
    rows = mx.arange(q)[:, None] + (valid_to - q)
    cols = mx.arange(keys)[None, :]
    return (cols <= rows) & (cols >= valid_from)


def additive(mask: mx.array, dtype) -> mx.array:
    return mx.where(mask, mx.array(0, dtype), mx.array(-float("inf"), dtype))


def attention_check(
    ops, dtype_name, dtype, t, qlens, d, hq, hkv, pads, key, ref_q, deep_qlens=None
) -> Check:
    """Every q in qlens under every mask form; the q in deep_qlens (default: all of qlens)
    also with sinks, behind a grown cache and left-padded in company."""
    deep = set(qlens if deep_qlens is None else deep_qlens)
    scale = d**-0.5
    check = Check("attention", f"keys={t} D={d} heads={hq}/{hkv}", dtype_name)
    q_all = rand((1, hq, t, d), dtype, key)
    k = rand((1, hkv, t, d), dtype, key + 1)
    v = rand((1, hkv, t, d), dtype, key + 2)
    sinks = rand((hq,), dtype, key + 3)
    r = min(ref_q, t)
    extra = 37  # keys appended after the row, masked: a preallocated, grown cache
    k_grown = mx.concatenate([k, rand((1, hkv, extra, d), dtype, key + 4)], axis=2)
    v_grown = mx.concatenate([v, rand((1, hkv, extra, d), dtype, key + 5)], axis=2)
    for sink in (None, sinks):
        ref = bits(ops.sdpa(q_all[:, :, t - r :], k, v, scale, "causal", sink))[0]
        tag = " sinks" if sink is not None else ""
        for q in (q for q in qlens if q <= r and (sink is None or q in deep)):
            tail = q_all[:, :, t - q :]
            want = ref[:, r - q :]
            m = causal_bool(q, t)
            forms = {"causal": "causal", "bool": m, "additive": additive(m, dtype)}
            if q == 1:
                forms["None"] = None
            for name, mask in forms.items():
                got = bits(ops.sdpa(tail, k, v, scale, mask, sink))[0]
                check.record(got, want, f"q={q} mask={name}{tag}")
            if sink is not None or q not in deep:
                continue
            grown = causal_bool(q, t + extra, valid_to=t)
            got = bits(ops.sdpa(tail, k_grown, v_grown, scale, grown, None))[0]
            check.record(got, want, f"q={q} cache grown by {extra} masked keys")
            for pad in pads:
                got = _in_padded_company(ops, dtype, tail, k, v, scale, q, pad, key + 6)
                check.record(got, want, f"q={q} left pad {pad} in a batch of 3")
    return check


def _in_padded_company(ops, dtype, tail, k, v, scale, q, pad, key):
    """The target sequence at batch index 1, between two others, left-padded by `pad`."""
    _, hkv, t, d = k.shape
    hq = tail.shape[1]
    lengths = [max(q, t // 2 + 3), t, t + 5]
    width = max(lengths) + pad
    qs, ks, vs, masks = [], [], [], []
    for i, length in enumerate(lengths):
        front = width - length
        if i == 1:
            qi, ki, vi = tail, k, v
        else:
            qi = rand((1, hq, q, d), dtype, key + 10 * i)
            ki = rand((1, hkv, length, d), dtype, key + 10 * i + 1)
            vi = rand((1, hkv, length, d), dtype, key + 10 * i + 2)
        junk_k = rand((1, hkv, front, d), dtype, key + 10 * i + 3)
        junk_v = rand((1, hkv, front, d), dtype, key + 10 * i + 4)
        qs.append(qi)
        ks.append(mx.concatenate([junk_k, ki], axis=2))
        vs.append(mx.concatenate([junk_v, vi], axis=2))
        masks.append(causal_bool(q, width, valid_from=front))
    mask = mx.stack(masks)[:, None]  # (3, 1, q, width)
    out = ops.sdpa(mx.concatenate(qs), mx.concatenate(ks), mx.concatenate(vs), scale, mask, None)
    return bits(out)[1]


def ring_layout(k: mx.array, capacity: int) -> tuple[mx.array, mx.array]:
    """The last `capacity` keys of k [B, H, T, D] (position order) as a rotating cache holds
    them after writing position P at slot P % capacity: (storage, key_start [B])."""
    n = k.shape[2]
    slots = [(n - capacity + j) % capacity for j in range(capacity)]
    order = np.argsort(slots)  # slot s holds logical key order[s]
    storage = k[:, :, n - capacity :][:, :, mx.array(order)]
    return storage, mx.array([n % capacity] * k.shape[0], mx.int32)


def window_check(ops, dtype_name, dtype, t, window, d, hq, hkv, key, qlens=(1, 8, 9)) -> Check:
    """Rows of a sliding-window layer over t keys, every tail length q in qlens."""
    scale = d**-0.5
    check = Check("attention", f"window={window} keys={t} D={d} heads={hq}/{hkv}", dtype_name)
    r = min(max(qlens), t)
    q_all = rand((1, hq, t, d), dtype, key)
    k = rand((1, hkv, t, d), dtype, key + 1)
    v = rand((1, hkv, t, d), dtype, key + 2)
    ref = bits(ops.sdpa(q_all[:, :, t - r :], k, v, scale, "causal", None, window=window))[0]
    for q in (q for q in qlens if q <= r):
        tail = q_all[:, :, t - q :]
        want = ref[:, r - q :]
        got = ops.sdpa(tail, k, v, scale, "causal" if q > 1 else None, None, window=window)
        check.record(bits(got)[0], want, f"q={q} window argument")
        got = ops.sdpa(tail, k, v, scale, window_mask(q, t, window), None)
        check.record(bits(got)[0], want, f"q={q} window as a bool mask")
        for cap in sorted({window + q - 1, window + 37}):
            if cap > t:
                continue
            (rk, ks), (rv, _) = ring_layout(k, cap), ring_layout(v, cap)
            got = ops.sdpa(tail, rk, rv, scale, "causal", None, window=window, key_start=ks)
            check.record(bits(got)[0], want, f"q={q} ring of {cap} ({t // cap} wraps)")
        got = _windowed_in_padded_company(ops, dtype, tail, k, v, scale, window, key + 3)
        check.record(got, want, f"q={q} left pad 37 in a batch of 2")
    return check


def _windowed_in_padded_company(ops, dtype, tail, k, v, scale, window, key):
    """The target sequence at batch index 1, left-padded by 37, after a longer sequence."""
    _, hkv, t, d = k.shape
    pad, q = 37, tail.shape[2]
    width = t + pad
    other = [rand((1, hkv, width, d), dtype, key + i) for i in range(2)]
    kb = mx.concatenate([other[0], mx.concatenate([other[1][:, :, :pad], k], axis=2)])
    vb = mx.concatenate([other[1], mx.concatenate([other[0][:, :, :pad], v], axis=2)])
    qb = mx.concatenate([rand(tail.shape, dtype, key + 2), tail])
    mask = mx.stack([causal_bool(q, width), causal_bool(q, width, valid_from=pad)])[:, None]
    return bits(ops.sdpa(qb, kb, vb, scale, mask, None, window=window))[1]
