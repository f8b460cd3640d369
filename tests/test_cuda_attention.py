"""CUDA attention (bi_rl/backends/cuda/attention.py), on the device only.

Properties: a query row's output bits are the same computed as a decode step, inside a prefill
chunk of 8 or 9, or inside a full causal prefill; on both sides of 256, 512 (the split) and 4096
keys; in split
or sequential mode and with any number of warps; left-padded inside a batch of other
sequences; read from a sliced, preallocated cache or behind keys appended and masked after it;
and under every equivalent mask form; under a bool mask, each row's first and last valid key
found exactly wherever they sit against the mask search's rounds; at head dims 64 to 256.
With a sliding window: the same bits from the window argument, the window as a mask and a
ring after several wrap-arounds, in every configuration, and keys before the window are
never read (NaN there changes nothing).
Outputs match a float64 reference (and stock MLX's semantics) within the stated tolerance,
every output is written, and stock MLX shows the decode/prefill variance on the same inputs
(negative control). tests/test_attention_window.py checks the window's semantics through
bi_rl.ops, which runs these kernels on the device.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from conftest import assert_same_bits, attention_reference, bits, f64, rand, relerr, ring_of

from bi_rl import _mask_window as mask_window
from bi_rl import _stock
from bi_rl._split import split_keys
from bi_rl.backends.base import Unsupported
from bi_rl.backends.composed import window_mask
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


@pytest.mark.parametrize("d", [64, 256])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("keys", [255, 256, 257, 511, 512, 513, 4095, 4096, 4097])
def test_decode_chunks_and_full_prefill_give_the_same_bits(dtype, keys, d):
    dt = DTYPES[dtype]
    q, k, v = _qkv(1, 14, 2, keys, keys, d, dt, keys)
    scale = d**-0.5
    full = sdpa(q, k, v, scale, "causal")
    last = lambda n: full[:, :, keys - n :]
    assert_same_bits(sdpa(q[:, :, -1:], k, v, scale), last(1), "decode step vs full prefill")
    for n in (8, 9, 16):
        assert_same_bits(
            sdpa(q[:, :, -n:], k, v, scale, "causal"), last(n), f"chunk of {n} vs full prefill"
        )
    for i in (0, 63, 64, 255, 256, 511, 512):
        if i < keys:
            step = sdpa(q[:, :, i : i + 1], k[:, :, : i + 1], v[:, :, : i + 1], scale)
            assert_same_bits(step, full[:, :, i : i + 1], f"decode at position {i} vs full prefill")
    if dt != mx.float32:  # the paths under test really differ
        rows = 14 // 2
        assert A.choose_config(1, 2, rows, keys, d) != A.choose_config(1, 2, keys * rows, keys, d)
        if d == 256:  # and every configuration, split mode included, agrees at this length
            for cfg in A.configs():
                assert_same_bits(
                    sdpa(q[:, :, -9:], k, v, scale, "causal", config=cfg), last(9), str(cfg)
                )


@pytest.mark.parametrize("d", [128, 256])
@pytest.mark.parametrize("tq", [1, 9])
def test_every_configuration_gives_the_same_bits(tq, d):
    q, k, v = _qkv(2, 8, 2, tq, 1500, d, mx.bfloat16, 7)
    scale = d**-0.5
    ring = {"key_start": mx.array([123, -1], mx.int32)}
    forms = {
        "causal": ("causal", {}),
        "bool, left pad 100": (causal_bool(tq, 1500, valid_from=100), {}),
        "causal, window 600": ("causal", {"window": 600}),
        "bool, left pad 100, window 600, ring": (
            causal_bool(tq, 1500, 100),
            {"window": 600, **ring},
        ),
    }
    for name, (mask, kw) in forms.items():
        outs = [(cfg, sdpa(q, k, v, scale, mask, **kw, config=cfg)) for cfg in A.configs()]
        for cfg, out in outs[1:]:
            assert_same_bits(out, outs[0][1], f"{cfg} vs {outs[0][0]} (tq={tq}, {name})")


@pytest.mark.parametrize("keys", [1023, 1024, 1025, 4095, 4096, 4097])
def test_splits_per_block_edges_give_the_same_bits(keys):
    """Split mode with every number of splits a block the planner can pick (1, 4 and 16 at
    256 keys a split; 1, 2 and 8 at 512: blocks of 256, 1024 and 4096 keys), on both sides of
    a 1024-key and a 4096-key block: a decode row and a chunk of 9, rows of a batch left-padded
    by different amounts (so each block's splits end at other places), against the
    sequential kernel and against the full causal prefill."""
    d, hq, hkv, pad = 128, 4, 2, 300
    q, k, v = _qkv(3, hq, hkv, 9, keys + pad, d, mx.bfloat16, keys)
    scale = d**-0.5
    valid = [causal_bool(9, keys + pad, valid_from=p) for p in (0, 37, pad)]
    mask = mx.stack(valid)[:, None]  # (3, 1, 9, keys + pad): a different first key per row
    seq = A.AttnConfig(1, 2, False)
    steps = A.splits_per_block_steps(split_keys())
    cfgs = [A.AttnConfig(1, 2, True, n) for n in steps] + [A.AttnConfig(2, 3, True, steps[-1])]
    for tq in (1, 9):
        m = mask[:, :, 9 - tq :]
        want = sdpa(q[:, :, 9 - tq :], k, v, scale, m, config=seq)
        for cfg in cfgs:
            got = sdpa(q[:, :, 9 - tq :], k, v, scale, m, config=cfg)
            assert_same_bits(got, want, f"{keys} keys, tq={tq}: {cfg} vs sequential")
    full = sdpa(q[2:], k[2:], v[2:], scale, "causal")  # a batch of one, every key valid
    for cfg in cfgs:
        one = sdpa(q[2:, :, -1:], k[2:], v[2:], scale, config=cfg)
        assert_same_bits(one, full[:, :, -1:], f"{keys} keys: decode, {cfg}, vs full prefill")


@pytest.mark.parametrize("d", A.HEAD_DIMS)
@pytest.mark.parametrize("splits", [7, 31, 32, 33, 64, 65])
def test_combine_batch_edges_give_the_same_bits(monkeypatch, splits, d):
    """Split mode's combine gives a row one warp for each 32 of its values (the last one
    partly idle at head dim 80) and folds the splits' partials 32 at a time, reading the next
    32 while it folds: rows of 7, 31, 32, 33, 64 and 65 splits (the last one short by a key)
    at every head dim, a second row left-padded so that its last splits' partials are empty,
    against the sequential kernel; guard: the plan had a combine launch."""
    hq, hkv, pad = 4, 2, 300
    keys = split_keys() * splits - 1
    q, k, v = _qkv(2, hq, hkv, 1, keys + pad, d, mx.bfloat16, splits)
    scale = d**-0.5
    mask = mx.stack([causal_bool(1, keys + pad, valid_from=p) for p in (0, pad)])[:, None]
    want = sdpa(q, k, v, scale, mask, config=A.AttnConfig(1, 2, False))
    plans = []
    real = A._plan
    monkeypatch.setattr(A, "_PLANS", type(A._PLANS)())
    monkeypatch.setattr(A, "_plan", lambda *a: plans.append(real(*a)) or plans[-1])
    got = sdpa(q, k, v, scale, mask, config=A.AttnConfig(1, 2, True))
    assert plans and plans[-1][1] is not None, "the split launch and its combine ran"
    assert_same_bits(got, want, f"{splits} splits: split mode vs sequential")


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
        assert_same_bits(out[1:2], alone, f"left padding {pad} in a batch of 3")


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_sliced_preallocated_and_grown_caches_move_nothing(dtype):
    dt = DTYPES[dtype]
    n, cap, d = 517, 768, 96
    q = rand((2, 8, 1, d), dt, 40)
    buf_k, buf_v = rand((2, 2, cap, d), dt, 41), rand((2, 2, cap, d), dt, 42)
    k, v = buf_k[:, :, :n], buf_v[:, :, :n]  # views into a preallocated cache
    scale = d**-0.5
    want = sdpa(q, mx.contiguous(k), mx.contiguous(v), scale)
    assert_same_bits(sdpa(q, k, v, scale), want, "sliced cache view vs contiguous copy")
    for extra in (1, 37, 251):  # keys appended after the row, masked for it
        grown = causal_bool(1, n + extra, valid_to=n)
        out = sdpa(q, buf_k[:, :, : n + extra], buf_v[:, :, : n + extra], scale, grown)
        assert_same_bits(out, want, f"cache grown by {extra} masked keys")
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
        assert_same_bits(sdpa(q, k, v, scale, mask), want, f"mask {name} vs 'causal'")


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
        ref = attention_reference(q, k, v, scale, "causal", s)
        err, err_stock = relerr(out, ref), relerr(stock, ref)
        print(f"{dtype} D={d} sinks={s is not None}: ours {err:.2e} stock {err_stock:.2e}")
        assert err < TOLERANCE[dtype], f"relative error {err:.2e} (stock {err_stock:.2e})"
        assert_same_bits(step, out[:, :, -1:], f"decode vs prefill, D={d}, sinks={s is not None}")


def test_semantics_match_stock_mlx():
    """Same function as mx.fast.scaled_dot_product_attention for each mask form (to rounding)."""
    q, k, v = _qkv(3, 8, 4, 5, 200, 128, mx.float16, 70)
    scale = 0.09
    pad = causal_bool(5, 200, valid_from=17)
    add = rand((3, 1, 5, 200), mx.float16, 71)
    masks = (None, "causal", pad, add, mx.where(pad, add, mx.array(-np.inf, mx.float16)))
    outs = [sdpa(q, k, v, scale, mask) for mask in masks]
    for mask, ours in zip(masks, outs, strict=True):
        ref = attention_reference(q, k, v, scale, mask)
        stock = _stock.scaled_dot_product_attention(q, k, v, scale=scale, mask=mask)
        assert relerr(ours, ref) < TOLERANCE["float16"]
        assert relerr(stock, ref) < 10 * TOLERANCE["float16"], "reference disagrees with MLX"


def test_stock_attention_is_variant_between_decode_and_prefill():
    """Negative control on the inputs of the decode test."""
    q, k, v = _qkv(1, 14, 2, 1000, 1000, 64, mx.bfloat16, 80)
    scale = 0.125
    full = _stock.scaled_dot_product_attention(q, k, v, scale=scale, mask="causal")
    step = _stock.scaled_dot_product_attention(q[:, :, -1:], k, v, scale=scale)
    assert (bits(step) != bits(full[:, :, -1:])).any(), "stock agreed: the control proves nothing"


# (first, last) valid key of a row, either side of the edges of the mask search's rounds (a
# warp searches forward from the first candidate key and backward from the last, 32 keys a
# round, one read a lane; 256 with eight reads a lane), and of 64-key blocks.
RANGE_EDGES = [
    (0, 1199),
    (31, 700),
    (32, 255),
    (255, 287),
    (256, 511),
    (257, 1199),
    (511, 512),
    (512, 1000),
    (767, 768),
    (1000, 1198),
    (1199, 1199),
]


@pytest.mark.parametrize("per_head", [False, True])
def test_mask_search_finds_each_rows_first_and_last_key_at_round_edges(per_head):
    """A row under a bool mask valid on keys [a, e] has the bits of the same query over keys
    a..e alone with no mask: its blocks are counted from the first valid key the search finds
    (the guard shows that counting them from one key earlier moves the bits), and a last key
    found short would drop keys. Rows of one query share a mask row when the mask has one for
    every head (per_head False: found once for the query's heads) or not (True: each head its
    own range, rotated by the head). 11 rows in one call (the prefill kernel), each against
    its own decode-sized call over its keys (the decode kernel)."""
    tk, d, hq, hkv = 1200, 64, 4, 2
    n = len(RANGE_EDGES)
    q, k, v = _qkv(1, hq, hkv, n, tk, d, mx.bfloat16, 95)
    scale = d**-0.5
    cols = np.arange(tk)
    m = np.zeros((1, hq if per_head else 1, n, tk), dtype=bool)
    for h in range(m.shape[1]):
        for i in range(n):
            a, e = RANGE_EDGES[(i + h) % n]
            m[0, h, i] = (cols >= a) & (cols <= e)
    out = sdpa(q, k, v, scale, mx.array(m))
    for h in range(hq):
        for i in range(n):
            a, e = RANGE_EDGES[(i + h * per_head) % n]
            kv = h // (hq // hkv)
            alone = sdpa(
                q[:, h : h + 1, i : i + 1],
                k[:, kv : kv + 1, a : e + 1],
                v[:, kv : kv + 1, a : e + 1],
                scale,
            )
            where = f"head {h} row {i}: keys {a}..{e}, per-head mask {per_head}"
            assert_same_bits(out[:, h : h + 1, i : i + 1], alone, where)
    # Guard: keys 31..700 counted from key 30 (valid under a finite additive mask of -1e30, so
    # it weighs exactly 0) give other bits than counted from key 31.
    qi, ki, vi = q[:, :1, 1:2], k[:, :1, 30:701], v[:, :1, 30:701]
    add = np.zeros((1, 1, 1, ki.shape[2]), dtype=np.float32)
    add[..., 0] = -1e30
    early = sdpa(qi, ki, vi, scale, mx.array(add).astype(mx.bfloat16))
    alone = sdpa(qi, ki[:, :, 1:], vi[:, :, 1:], scale)
    assert (bits(early) != bits(alone)).any(), "counting from one key earlier moved nothing"


def test_rows_without_a_valid_key_are_zero():
    q, k, v = _qkv(1, 4, 4, 3, 70, 64, mx.bfloat16, 90)
    mask = mx.array([[True] * 70, [False] * 70, [False] * 69 + [True]])
    out = f64(sdpa(q, k, v, 0.125, mask))
    assert (out[:, :, 1] == 0).all() and np.abs(out[:, :, 0]).sum() > 0
    ref = attention_reference(q[:, :, 2:], k, v, 0.125, mask[2:])
    assert np.abs(out[:, :, 2:] - ref).max() < 1e-2


def test_refuses_what_it_cannot_take():
    q, k, v = _qkv(1, 2, 2, 1, 10, 72, mx.bfloat16, 0)
    with pytest.raises(Unsupported, match="head dim 72"):
        sdpa(q, k, v, 0.1)
    q, k, v = _qkv(1, 2, 2, 1, 10, 64, mx.bfloat16, 0)
    with pytest.raises(Unsupported, match="mixed"):
        sdpa(q, k.astype(mx.float16), v, 0.1)


# ---- sliding windows and rings ----------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("d", [64, 256])
@pytest.mark.parametrize("w", [100, 512])
def test_window_edges_give_the_same_bits_in_all_three_layouts(dtype, d, w):
    """Full cache + window, full cache + window mask, ring after several wraps: decode and a
    prefill chunk of 9, with W - 1, W, W + 1 and many more keys, in every configuration."""
    dt = DTYPES[dtype]
    scale = d**-0.5
    for n in (w - 1, w, w + 1, 3 * w + 77):
        q, k, v = _qkv(1, 4, 2, 9, n, d, dt, n + d)
        for tq in (1, 9):
            qt = q[:, :, 9 - tq :]
            want = sdpa(qt, k, v, scale, "causal", window=w)
            assert_same_bits(sdpa(qt, k, v, scale, window_mask(tq, n, w)), want, f"{n} keys: mask")
            ref = attention_reference(qt, k, v, scale, window_mask(tq, n, w))
            assert relerr(want, ref) < TOLERANCE[dtype]
            cfgs = A.configs() if dt == mx.bfloat16 else [None]  # bits: every config
            for cap in {w + tq - 1, w + 37}:
                if cap > n:
                    continue
                (rk, ks), (rv, _) = ring_of(k, cap), ring_of(v, cap)
                for cfg in cfgs:
                    got = sdpa(qt, rk, rv, scale, "causal", window=w, key_start=ks, config=cfg)
                    assert_same_bits(
                        got, want, f"{n} keys, tq={tq}: ring of {cap}, {n // cap} wraps, {cfg}"
                    )


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("w", [100, 512])
def test_a_mask_noted_with_its_window_keeps_its_bits(monkeypatch, dtype, w):
    """A bool mask noted with the window folded into it (bi_rl._mask_window, as the windowed
    KV caches note theirs) is launched with that window (guard: the plan was built with it,
    and without it for the same mask unnoted) and gives the unnoted mask's bits: decode, a
    chunk of 9 and 32 queries (64 rows a kv head: the wgmma kernel's on Hopper where the
    window leaves out no key), over W - 1, W, W + 1 and many more keys, a left-padded
    sequence beside one that is not."""
    dt = DTYPES[dtype]
    d, hq, hkv, pad = 128, 4, 2, 37
    scale = d**-0.5
    windows, real = [], A._planned
    monkeypatch.setattr(A, "_PLANS", type(A._PLANS)())
    monkeypatch.setattr(A, "_planned", lambda *a: windows.append(a[7]) or real(*a))

    def masks(tq, n):
        keys = mx.arange(n)[None, :]
        return mx.stack([window_mask(tq, n, w), window_mask(tq, n, w) & (keys >= pad)])[:, None]

    for n in (w - 1, w, w + 1, 3 * w + 77):
        for tq in (1, 9, 32):
            q, k, v = _qkv(2, hq, hkv, tq, n, d, dt, n + tq)
            want = sdpa(q, k, v, scale, masks(tq, n))
            noted = masks(tq, n)
            mask_window.note(noted, w)
            got = sdpa(q, k, v, scale, noted)
            assert windows[-2:] == [None, w], f"{n} keys, tq={tq}: the window reached the plan"
            assert_same_bits(got, want, f"{n} keys, tq={tq}: noted mask vs the same unnoted")


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("n, w", [(1500, 1000), (20000, 17000)])  # sequential, split mode
def test_window_with_left_padding_and_sinks_inside_a_batch(dtype, n, w):
    """A windowed decode row alone vs left-padded between two other sequences, with sinks.
    The window counts back from the last key given (lower-right), as in a left-padded cache."""
    dt = DTYPES[dtype]
    d, hq, hkv, pad = 128, 8, 2, 37
    sinks = rand((hq,), dt, 5)
    q, k, v = _qkv(1, hq, hkv, 1, n, d, dt, n)
    alone = sdpa(q, k, v, d**-0.5, None, sinks, window=w)
    lengths = [n - 200, n, n + 5]
    width = max(lengths) + pad
    qs, ks, vs, masks = [], [], [], []
    for i, length in enumerate(lengths):
        qi, ki, vi = (q, k, v) if i == 1 else _qkv(1, hq, hkv, 1, length, d, dt, 10 * i)
        junk = _qkv(1, hkv, hkv, 1, width - length, d, dt, 10 * i + 5)[1:]
        qs.append(qi)
        ks.append(mx.concatenate([junk[0], ki], axis=2))
        vs.append(mx.concatenate([junk[1], vi], axis=2))
        masks.append(causal_bool(1, width, valid_from=width - length))
    mask = mx.stack(masks)[:, None]
    qb, kb, vb = mx.concatenate(qs), mx.concatenate(ks), mx.concatenate(vs)
    out = sdpa(qb, kb, vb, d**-0.5, mask, sinks, window=w)
    assert_same_bits(out[1:2], alone, f"{n} keys, window {w}: left-padded in a batch of 3")
    assert_same_bits(
        sdpa(qb, kb, vb, d**-0.5, mask & window_mask(1, width, w), sinks), out, "as a mask"
    )
    if dt != mx.float32:  # both sides of split mode's threshold, decided by the window
        assert A.choose_config(3, hkv, hq // hkv, w, d).split == (w > 16384)


def test_keys_before_the_window_are_never_read():
    """Guard: NaN keys and values before a row's window leave it bit-identical (they were
    skipped, not multiplied by zero); every row whose window holds them comes out different
    (the kernel returns zeros for a row whose softmax sum is NaN), and so does plain
    attention over the same cache, which reads them."""
    for dt, d in ((mx.bfloat16, 64), (mx.bfloat16, 256), (mx.float32, 64)):
        n, w, scale = 300, 100, d**-0.5
        q, k, v = _qkv(1, 4, 2, n, n, d, dt, 40)
        clean = sdpa(q, k, v, scale, "causal", window=w)
        nan = mx.full((1, 2, 64, d), float("nan"), dt)
        bad_k = mx.concatenate([nan, k[:, :, 64:]], axis=2)
        bad_v = mx.concatenate([nan, v[:, :, 64:]], axis=2)
        got = sdpa(q, bad_k, bad_v, scale, "causal", window=w)
        late = slice(64 + w - 1, n)  # rows whose window starts after the poisoned keys
        assert_same_bits(
            got[:, :, late], clean[:, :, late], f"{dt} D={d}: rows whose window skips NaN"
        )
        seen = (bits(got[:, :, :64]) != bits(clean[:, :, :64])).any(axis=-1)
        assert seen.all(), "the poison never reached rows that see it"
        plain = sdpa(q[:, :, -1:], bad_k, bad_v, scale)
        assert (bits(plain) != bits(sdpa(q[:, :, -1:], k, v, scale))).any(), "no window"
        # the same through a ring whose 50 oldest keys (outside the window) are NaN
        cap = w + 50
        (rk, ks), (rv, _) = ring_of(k, cap), ring_of(v, cap)
        oldest = np.zeros((1, 1, cap, 1), bool)
        oldest[0, 0, [(n - cap + j) % cap for j in range(50)]] = True
        rk = mx.where(mx.array(oldest), mx.array(float("nan"), dt), rk)
        rv = mx.where(mx.array(oldest), mx.array(float("nan"), dt), rv)
        got = sdpa(q[:, :, -1:], rk, rv, scale, None, window=w, key_start=ks)
        assert_same_bits(got, clean[:, :, -1:], f"{dt} D={d}: ring with NaN outside the window")


def test_stock_windowed_attention_is_variant_between_layouts():
    """Negative control: stock MLX, the window as a mask, full-sequence pass vs decode steps
    from the cache (the layouts the kernel makes agree)."""
    n, w = 2000, 1024
    q, k, v = _qkv(1, 14, 2, n, n, 64, mx.bfloat16, 80)
    full = _stock.scaled_dot_product_attention(q, k, v, scale=0.125, mask=window_mask(n, n, w))
    diffs = 0
    for i in (n - 1, n - 2, 1500):
        step = _stock.scaled_dot_product_attention(
            q[:, :, i : i + 1],
            k[:, :, : i + 1],
            v[:, :, : i + 1],
            scale=0.125,
            mask=window_mask(1, i + 1, w),
        )
        diffs += int((bits(step) != bits(full[:, :, i : i + 1])).sum())
    assert diffs > 0, "stock agreed: the control proves nothing"


def test_head_dim_256_writes_both_column_halves():
    """Every output column of the two-block D = 256 path is written (poisoned output)."""
    for tq, cfg in ((1, None), (9, A.AttnConfig(1, 2, True))):
        q, k, v = _qkv(2, 4, 2, tq, 300, 256, mx.bfloat16, 1)
        out = sdpa(q, k, v, 0.0625, "causal", config=cfg, poison=float("nan"))
        assert not np.isnan(f64(out)).any(), f"an output column half was never written ({cfg})"
