"""CUDA attention (bi_rl/backends/cuda/attention.py), on the device only.

Properties: a query row's output bits are the same computed as a decode step, inside a prefill
chunk of 8 or 9, or inside a full causal prefill; on both sides of 256 and 4096 keys; in split
or sequential mode and with any number of warps; left-padded inside a batch of other
sequences; read from a sliced, preallocated cache or behind keys appended and masked after it;
and under every equivalent mask form. Outputs match a float64 reference (and stock MLX's
semantics) within the stated tolerance, every output is written, and stock MLX shows the
decode/prefill variance on the same inputs (negative control).
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from conftest import bits, rand

from bi_rl import _stock
from bi_rl.backends.base import Unsupported
from bi_rl.backends.cuda import attention as A

pytestmark = pytest.mark.skipif(not mx.cuda.is_available(), reason="needs MLX's CUDA backend")

DTYPES = {"bfloat16": mx.bfloat16, "float16": mx.float16, "float32": mx.float32}
TOLERANCE = {"bfloat16": 1e-2, "float16": 2e-3, "float32": 1e-5}
sdpa = A.scaled_dot_product_attention


def _qkv(b, hq, hkv, tq, tk, d, dtype, key):
    return (
        rand((b, hq, tq, d), dtype, key),
        rand((b, hkv, tk, d), dtype, key + 1),
        rand((b, hkv, tk, d), dtype, key + 2),
    )


def causal_bool(q, keys, valid_from=0, valid_to=None):
    """Lower-right causal bool mask (q, keys) over keys [valid_from, valid_to)."""
    valid_to = keys if valid_to is None else valid_to
    rows = mx.arange(q)[:, None] + (valid_to - q)
    cols = mx.arange(keys)[None, :]
    return (cols <= rows) & (cols >= valid_from)


def _f64(x):
    return np.array(x.astype(mx.float32), dtype=np.float64)


def reference(q, k, v, scale, mask=None, sinks=None):
    """float64 attention with MLX's semantics (masked rows excluded exactly)."""
    qf, kf, vf = _f64(q), _f64(k), _f64(v)
    r = q.shape[1] // k.shape[1]
    kf, vf = np.repeat(kf, r, axis=1), np.repeat(vf, r, axis=1)
    s = np.einsum("bhqd,bhkd->bhqk", qf, kf) * scale
    tq, tk = q.shape[2], k.shape[2]
    if isinstance(mask, str):
        s = np.where(np.array(causal_bool(tq, tk)), s, -np.inf)
    elif mask is not None and mask.dtype == mx.bool_:
        s = np.where(np.array(mask), s, -np.inf)
    elif mask is not None:
        s = s + _f64(mask)
    if sinks is not None:
        sk = np.broadcast_to(_f64(sinks)[None, :, None, None], s.shape[:3] + (1,))
        s = np.concatenate([sk, s], axis=-1)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    if sinks is not None:
        p = p[..., 1:]
    return np.einsum("bhqk,bhkd->bhqd", p, vf)


def _relerr(out, ref):
    return float(np.linalg.norm(_f64(out) - ref) / np.linalg.norm(ref))


def _same(got, want, what):
    g, w = bits(got), bits(want)
    bad = int((g != w).sum())
    assert bad == 0, f"{what}: {bad} of {w.size} outputs differ"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("keys", [255, 256, 257, 4095, 4096, 4097])
def test_decode_chunks_and_full_prefill_give_the_same_bits(dtype, keys):
    dt = DTYPES[dtype]
    q, k, v = _qkv(1, 14, 2, keys, keys, 64, dt, keys)
    scale = 64**-0.5
    full = sdpa(q, k, v, scale, "causal")
    last = lambda n: full[:, :, keys - n :]
    _same(sdpa(q[:, :, -1:], k, v, scale), last(1), "decode step vs full prefill")
    for n in (8, 9, 16):
        _same(sdpa(q[:, :, -n:], k, v, scale, "causal"), last(n), f"chunk of {n} vs full prefill")
    for i in (0, 63, 64, 255, 256):
        if i < keys:
            step = sdpa(q[:, :, i : i + 1], k[:, :, : i + 1], v[:, :, : i + 1], scale)
            _same(step, full[:, :, i : i + 1], f"decode at position {i} vs full prefill")
    if dt != mx.float32:  # the paths under test really differ
        rows = 14 // 2
        assert A.choose_config(1, 2, rows, keys, 64) != A.choose_config(1, 2, keys * rows, keys, 64)


@pytest.mark.parametrize("tq", [1, 9])
def test_every_configuration_gives_the_same_bits(tq):
    q, k, v = _qkv(2, 8, 2, tq, 1500, 128, mx.bfloat16, 7)
    scale = 128**-0.5
    for mask in ("causal", causal_bool(tq, 1500, valid_from=100)):
        outs = [(cfg, sdpa(q, k, v, scale, mask, config=cfg)) for cfg in A.configs()]
        for cfg, out in outs[1:]:
            _same(out, outs[0][1], f"{cfg} vs {outs[0][0]} (tq={tq})")


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("tq", [1, 9])
def test_left_padding_inside_a_batch_moves_nothing(dtype, tq):
    dt = DTYPES[dtype]
    t, d, hq, hkv = 700, 64, 14, 2
    q, k, v = _qkv(1, hq, hkv, tq, t, d, dt, 11)
    scale = d**-0.5
    alone = sdpa(q, k, v, scale, "causal" if tq > 1 else None)
    for pad in (0, 1, 63, 64, 300):
        lengths = [t // 2 + 3, t, t + 5]
        width = max(lengths) + pad
        qs, ks, vs, masks = [], [], [], []
        for i, length in enumerate(lengths):
            front = width - length
            qi, ki, vi = (q, k, v) if i == 1 else _qkv(1, hq, hkv, tq, length, d, dt, 20 + i)
            junk = _qkv(1, hkv, hkv, 1, front, d, dt, 30 + i)[1:] if front else None
            if junk:
                ki = mx.concatenate([junk[0], ki], axis=2)
                vi = mx.concatenate([junk[1], vi], axis=2)
            qs.append(qi)
            ks.append(ki)
            vs.append(vi)
            masks.append(causal_bool(tq, width, valid_from=front))
        mask = mx.stack(masks)[:, None]
        out = sdpa(mx.concatenate(qs), mx.concatenate(ks), mx.concatenate(vs), scale, mask)
        _same(out[1:2], alone, f"left padding {pad} in a batch of 3")


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_sliced_preallocated_and_grown_caches_move_nothing(dtype):
    dt = DTYPES[dtype]
    n, cap, d = 517, 768, 96
    q = rand((2, 8, 1, d), dt, 40)
    buf_k, buf_v = rand((2, 2, cap, d), dt, 41), rand((2, 2, cap, d), dt, 42)
    k, v = buf_k[:, :, :n], buf_v[:, :, :n]  # views into a preallocated cache
    scale = d**-0.5
    want = sdpa(q, mx.contiguous(k), mx.contiguous(v), scale)
    _same(sdpa(q, k, v, scale), want, "sliced cache view vs contiguous copy")
    for extra in (1, 37, 251):  # keys appended after the row, masked for it
        grown = causal_bool(1, n + extra, valid_to=n)
        out = sdpa(q, buf_k[:, :, : n + extra], buf_v[:, :, : n + extra], scale, grown)
        _same(out, want, f"cache grown by {extra} masked keys")
    assert (bits(buf_k[:, :, n : n + 1]) != 0).any(), "the appended keys are not zeros"


def test_equivalent_mask_forms_give_the_same_bits():
    q, k, v = _qkv(2, 14, 2, 9, 300, 64, mx.bfloat16, 50)
    scale = 0.125
    want = sdpa(q, k, v, scale, "causal")
    m = causal_bool(9, 300)
    forms = {
        "bool 2-D": m,
        "bool 4-D": m[None, None],
        "bool broadcast to every head": mx.broadcast_to(m, (2, 14, 9, 300)),
        "additive": mx.where(m, mx.array(0.0, mx.bfloat16), mx.array(-float("inf"), mx.bfloat16)),
    }
    for name, mask in forms.items():
        _same(sdpa(q, k, v, scale, mask), want, f"mask {name} vs 'causal'")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("d", A.HEAD_DIMS)
def test_head_dims_accuracy_and_sinks(dtype, d):
    dt = DTYPES[dtype]
    q, k, v = _qkv(2, 14, 2, 33, 300, d, dt, d)
    sinks = rand((14,), dt, 60)
    scale = d**-0.5
    runs = []
    for s in (None, sinks):
        out = sdpa(q, k, v, scale, "causal", s, poison=float("nan"))
        step = sdpa(q[:, :, -1:], k, v, scale, None, s)
        stock = _stock.scaled_dot_product_attention(q, k, v, scale=scale, mask="causal", sinks=s)
        runs.append((s, out, step, stock))
    for s, out, step, stock in runs:
        ref = reference(q, k, v, scale, "causal", s)
        err, err_stock = _relerr(out, ref), _relerr(stock, ref)
        print(f"{dtype} D={d} sinks={s is not None}: ours {err:.2e} stock {err_stock:.2e}")
        assert err < TOLERANCE[dtype], f"relative error {err:.2e} (stock {err_stock:.2e})"
        _same(step, out[:, :, -1:], f"decode vs prefill, D={d}, sinks={s is not None}")


def test_semantics_match_stock_mlx():
    """Same function as mx.fast.scaled_dot_product_attention for each mask form (to rounding)."""
    q, k, v = _qkv(3, 8, 4, 5, 200, 128, mx.float16, 70)
    scale = 0.09
    pad = causal_bool(5, 200, valid_from=17)
    add = rand((3, 1, 5, 200), mx.float16, 71)
    masks = (None, "causal", pad, add, mx.where(pad, add, mx.array(-np.inf, mx.float16)))
    outs = [sdpa(q, k, v, scale, mask) for mask in masks]
    for mask, ours in zip(masks, outs, strict=True):
        ref = reference(q, k, v, scale, mask)
        stock = _stock.scaled_dot_product_attention(q, k, v, scale=scale, mask=mask)
        assert _relerr(ours, ref) < TOLERANCE["float16"]
        assert _relerr(stock, ref) < 10 * TOLERANCE["float16"], "reference disagrees with MLX"


def test_stock_attention_is_variant_between_decode_and_prefill():
    """Negative control on the inputs of the decode test."""
    q, k, v = _qkv(1, 14, 2, 1000, 1000, 64, mx.bfloat16, 80)
    scale = 0.125
    full = _stock.scaled_dot_product_attention(q, k, v, scale=scale, mask="causal")
    step = _stock.scaled_dot_product_attention(q[:, :, -1:], k, v, scale=scale)
    assert (bits(step) != bits(full[:, :, -1:])).any(), "stock agreed: the control proves nothing"


def test_rows_without_a_valid_key_are_zero():
    q, k, v = _qkv(1, 4, 4, 3, 70, 64, mx.bfloat16, 90)
    mask = mx.array([[True] * 70, [False] * 70, [False] * 69 + [True]])
    out = _f64(sdpa(q, k, v, 0.125, mask))
    assert (out[:, :, 1] == 0).all() and np.abs(out[:, :, 0]).sum() > 0
    ref = reference(q[:, :, 2:], k, v, 0.125, mask[2:])
    assert np.abs(out[:, :, 2:] - ref).max() < 1e-2


def test_refuses_what_it_cannot_take():
    q, k, v = _qkv(1, 2, 2, 1, 10, 72, mx.bfloat16, 0)
    with pytest.raises(Unsupported, match="head dim 72"):
        sdpa(q, k, v, 0.1)
    q, k, v = _qkv(1, 2, 2, 1, 10, 64, mx.bfloat16, 0)
    with pytest.raises(Unsupported, match="mixed"):
        sdpa(q, k.astype(mx.float16), v, 0.1)
