"""Prefill attention on Hopper's wgmma (bi_rl/backends/cuda/hopper_attention.py).

On any machine with NVRTC: every instantiation (bf16 / f16, head dims 64 and 128, every mask
form, with and without a window) compiles for sm_90a with no spills and no serialised wgmma;
the declared shared memory matches the kernel's formula and fits a Hopper block; the path
stays off unless asked for and outside its scope.

On a Hopper GPU: the kernel's output bits equal the mma.sync kernel's (attention.py, forced
to sequential mode) on both sides of every block and split edge, with left padding, array
masks and windows, and a sequence alone equals the same sequence in a batch. The comparisons
with the mma.sync kernel hold only if the two MMA families give the same fp32 bits for the
same chain (tools/mma_equiv.cu); a failure there means decode and prefill must move to wgmma
together. The kernel's own invariance (a decode row has its prefill row's bits) is checked
apart from that.
"""

from __future__ import annotations

import inspect
import itertools
import re

import mlx.core as mx
import numpy as np
import pytest
from conftest import bits, rand

from bi_rl import _mask_window as mask_window
from bi_rl.backends.composed import window_mask
from bi_rl.backends.cuda import attention as A
from bi_rl.backends.cuda import hopper, mlx_jit, nvrtc
from bi_rl.backends.cuda import hopper_attention as H
from bi_rl.backends.cuda._kernels import tma_maps_words

on_hopper = pytest.mark.skipif(not hopper.available(), reason="needs a Hopper GPU and NVRTC")
has_nvrtc = pytest.mark.skipif(nvrtc.nvrtc_module() is None, reason="needs cuda-bindings")

SEQUENTIAL = A.AttnConfig(4, 2, False)  # the mma.sync kernel, whole rows in one block


# ---- any machine ----------------------------------------------------------------------------


@has_nvrtc
@pytest.mark.parametrize("dtype", [mx.bfloat16, mx.float16])
@pytest.mark.parametrize("d", H.HEAD_DIMS)
@pytest.mark.parametrize("nwg", [1, 2])
def test_every_instantiation_compiles_clean(tmp_path, monkeypatch, dtype, d, nwg):
    monkeypatch.setenv(nvrtc.CACHE_ENV, str(tmp_path))
    for kind, mdt in ((A.NO_MASK, None), (A.CAUSAL, None), (A.BOOL_MASK, mx.bool_),
                      (A.ADDITIVE, dtype)):  # fmt: skip
        for window in (0, 100):
            sp = H.spec(mdt is not None, d, nwg)
            t = H.template(dtype, d, kind, 0.088, window, nwg)
            ins = [(dtype, 4)] * 3 + ([(mdt, 4)] if mdt is not None else [])
            source = mlx_jit.render(sp, sp.header(), ins, [dtype], t)
            entry = "mlx::core::cu::" + mlx_jit.kernel_name(sp.name, t)
            built = nvrtc.compile_cubin(
                source, sp.name, "sm_90a", headers=mlx_jit.STAND_IN_HEADERS, names=(entry,)
            )
            what = f"attention {dtype} d{d} mask {kind} window {window} x{nwg}"
            _assert_clean(built, what)


def _assert_clean(built, what: str) -> None:
    assert not built.spills, f"{what} spills: {built.log}"
    # C7511 / C7514 / C7515: ptxas serialises the wgmma pipeline (registers short, or
    # accumulators touched while an MMA is in flight)
    serial = re.findall(r"C751[145]", built.log)
    assert not serial, f"{what}: ptxas serialises its wgmma ({serial}): {built.log}"


@has_nvrtc
@pytest.mark.parametrize("dtype", [mx.bfloat16, mx.float16])
@pytest.mark.parametrize("d", H.HEAD_DIMS)
def test_every_ping_pong_instantiation_compiles_clean(tmp_path, monkeypatch, dtype, d):
    """The ping-pong schedule (two warpgroups, no array mask), with and without a window, at
    its four stages, its K/V copied by cp.async or by TMA (the maps a uint32 output); the
    instantiation's name says it is the schedule compiled."""
    monkeypatch.setenv(nvrtc.CACHE_ENV, str(tmp_path))
    for kind, window, tma in itertools.product((A.NO_MASK, A.CAUSAL), (0, 100), (False, True)):
        sp = H.spec(False, d, 2, pp=True, tma=tma)
        t = H.template(dtype, d, kind, 0.088, window, 2, True)
        assert ("STAGES", H.PP_STAGES) in t and ("PP", True) in t
        ins = [(dtype, 4)] * 3
        outs = [dtype, mx.uint32] if tma else [dtype]
        source = mlx_jit.render(sp, sp.header(), ins, outs, t)
        entry = "mlx::core::cu::" + mlx_jit.kernel_name(sp.name, t)
        # the instantiation's name carries MASK, STAGES, NWG and PP (t: true) in order
        assert sp.name == ("bi_hattn_pp_t" if tma else "bi_hattn_pp"), sp.name
        assert f"_{kind}_{H.PP_STAGES}_2_t_" in entry, entry
        assert ("PP, true>(" in sp.source) == tma and ("(maps)" in sp.source) == tma
        built = nvrtc.compile_cubin(
            source, sp.name, "sm_90a", headers=mlx_jit.STAND_IN_HEADERS, names=(entry,)
        )
        what = f"ping-pong attention {dtype} d{d} mask {kind} window {window} tma {tma}"
        _assert_clean(built, what)


@has_nvrtc
@pytest.mark.parametrize("dtype, code", [(mx.bfloat16, 10), (mx.float16, 6)])
def test_the_tma_maps_carry_the_ptx_element_code_of_the_launch_dtype(dtype, code):
    """The K and V maps the TMA schedule writes name the launch's element type in
    tensormap.replace's encoding (.f16 6, .bf16 10; the driver's bf16 9 is .f64 there)."""
    sp = H.spec(False, 128, 2, pp=True, tma=True)
    t = H.template(dtype, 128, A.CAUSAL, 0.088, 0, 2, True)
    source = mlx_jit.render(sp, sp.header(), [(dtype, 4)] * 3, [dtype, mx.uint32], t)
    ptx = nvrtc.compile_ptx(source, sp.name, headers=mlx_jit.STAND_IN_HEADERS)
    pattern = r"tensormap\.replace\.tile\.elemtype\.shared::cta\.b1024\.b32 \[%r\d+\], (\d+);"
    assert re.findall(pattern, ptx) == [str(code)] * 2


def test_shared_memory_is_the_kernel_formula_and_fits(monkeypatch):
    from bi_rl._source import kernel_source

    src = kernel_source("cuda/hopper/attention.cu")
    assert "return 1024 + (D / 64) * AT_TILE * (NWG + 2 * STAGES) + 2 * 64 * NWG * 4 +" in src
    assert "         (D / 2) * 128 * NWG * 4 + 16 + 16 * STAGES + (TMA ? 384 : 0);" in src
    kv = 2 * H.STAGES  # K and V tiles of every stage
    bars = 16 * H.STAGES  # two mbarriers a stage
    assert H.shared_memory(64, 1) == 1024 + 8192 * (1 + kv) + 512 + 32 * 128 * 4 + 16 + bars
    assert H.shared_memory(128, 1) == 1024 + 16384 * (1 + kv) + 512 + 64 * 128 * 4 + 16 + bars
    assert H.shared_memory(128, 2) == 1024 + 16384 * (2 + kv) + 1024 + 64 * 256 * 4 + 16 + bars
    assert all(H.shared_memory(d, n) <= hopper.MAX_SHARED for d in H.HEAD_DIMS for n in (1, 2))
    # the ping-pong schedule's fourth stage fits beside two warpgroups at head dim 128
    assert H.shared_memory(128, 2, H.PP_STAGES) == 1024 + 16384 * 10 + 1024 + 65536 + 16 + 64
    assert H.shared_memory(128, 2, H.PP_STAGES) <= hopper.MAX_SHARED
    assert H.spec(False, 128, 2, pp=True).shared_memory == H.shared_memory(128, 2, H.PP_STAGES)
    # with TMA copies, the two maps and 128 bytes to align them
    with_maps = H.shared_memory(128, 2, H.PP_STAGES, tma=True)
    assert with_maps == H.shared_memory(128, 2, H.PP_STAGES) + 384 <= hopper.MAX_SHARED
    assert H.spec(False, 128, 2, pp=True, tma=True).shared_memory == with_maps
    monkeypatch.setenv(hopper.FILL_ENV, "0")  # the block-shape rule off: by rows alone
    assert [H.warpgroups(r, 128) for r in (64, 127, 128, 4096)] == [1, 1, 2, 2]
    assert [H.warpgroups(r, 64) for r in (64, 127, 128, 4096)] == [1, 1, 1, 1]


def test_with_the_block_shape_rule_two_warpgroups_only_where_their_blocks_fill(monkeypatch):
    """By default (or BI_RL_HOPPER_FILL=1): at head dim 128, two warpgroups a block only where
    the blocks of 128 rows reach hopper.FILL (70%) of the multiprocessors, both sides of that
    turning point; head dim 64 and fewer than 128 rows keep one; the rule off
    (BI_RL_HOPPER_FILL=0) keeps two."""
    need = hopper.fill_need()
    assert need == 93
    monkeypatch.delenv(hopper.FILL_ENV, raising=False)
    assert H.warpgroups(1200, 128, 8) == 1
    monkeypatch.setenv(hopper.FILL_ENV, "1")
    assert H.warpgroups(128 * (need - 1), 128) == 1
    assert H.warpgroups(128 * (need - 1) + 1, 128) == 2
    assert H.warpgroups(1200, 128, 8) == 1  # 600 tokens, 16 / 8 heads: 80 blocks of 128 rows
    assert H.warpgroups(1200, 128, 10) == 2  # 100
    assert H.warpgroups(4096, 64, 64) == 1 and H.warpgroups(127, 128, 1000) == 1
    monkeypatch.setenv(hopper.FILL_ENV, "0")
    assert H.warpgroups(1200, 128, 8) == 2


def test_the_path_is_on_where_hopper_runs_off_by_env_and_keeps_to_its_scope(monkeypatch):
    monkeypatch.delenv(H.ENV, raising=False)
    assert H.enabled() == hopper.available()
    monkeypatch.setenv(H.ENV, "0")
    assert not H.enabled()
    q = mx.zeros((1, 16, 64, 128), mx.bfloat16)
    k = mx.zeros((1, 8, 64, 128), mx.bfloat16)
    assert H.applies(q, k, None, None, None) and H.applies(q, k, None, None, mx.bool_)
    assert not H.applies(q, k, mx.zeros((16,), mx.bfloat16), None, None)  # sinks
    assert not H.applies(q, k, None, mx.zeros((1,), mx.int32), None)  # ring
    assert not H.applies(q.astype(mx.float32), k, None, None, None)
    assert not H.applies(q[..., :96], k[..., :96], None, None, None)  # head dim 96
    assert not H.applies(q[:, :, :31], k, None, None, None)  # 62 rows per kv head: too few
    assert H.applies(q[:, :, :32], k, None, None, None)  # 64
    # a window that leaves out keys gives rows first keys of their own (a pass each):
    # mma.sync; one as long as the keys (64 here) only bounds rows at their query
    assert not H.applies(q, k, None, None, None, window=63)
    assert H.applies(q, k, None, None, None, window=64) and H.applies(q, k, None, None, None, 4096)


def test_ping_pong_only_for_two_warpgroups_without_an_array_mask_and_when_asked(monkeypatch):
    monkeypatch.delenv(H.PP_ENV, raising=False)
    assert not H.pingpong(2, A.CAUSAL)  # off unless asked for
    monkeypatch.setenv(H.PP_ENV, "0")
    assert not H.pingpong(2, A.CAUSAL)
    monkeypatch.setenv(H.PP_ENV, "1")
    assert H.pingpong(2, A.CAUSAL) and H.pingpong(2, A.NO_MASK)
    assert not H.pingpong(1, A.CAUSAL)
    assert not H.pingpong(2, A.BOOL_MASK) and not H.pingpong(2, A.ADDITIVE)
    monkeypatch.setenv(H.PP_ENV, "yes")
    with pytest.raises(ValueError, match="BI_RL_HOPPER_PINGPONG must be 0 or 1"):
        H.pingpong(2, A.CAUSAL)


def test_tma_copies_only_in_the_ping_pong_schedule_and_when_asked(monkeypatch):
    """The K/V copies go through TMA where the ping-pong schedule runs and BI_RL_HOPPER_TMA=1
    (the GEMM's setting); the kernel's spec then has a second output, its maps (256 bytes a
    block and 128 more); TMA without the ping-pong schedule is refused."""
    monkeypatch.delenv(hopper.TMA_ENV, raising=False)
    assert not H.tma_copies(True)
    monkeypatch.setenv(hopper.TMA_ENV, "1")
    assert H.tma_copies(True) and not H.tma_copies(False)
    sp = H.spec(False, 128, 2, pp=True, tma=True)
    assert sp.outputs == ("out", "maps") and "cuda/hopper/tma.cuh" in sp.files
    assert tma_maps_words(520) == 64 * 520 + 32
    with pytest.raises(ValueError, match="ping-pong schedule only"):
        H.spec(False, 128, 2, pp=False, tma=True)
    monkeypatch.setenv(hopper.TMA_ENV, "on")
    with pytest.raises(ValueError, match="BI_RL_HOPPER_TMA must be 0 or 1"):
        H.tma_copies(True)


def _record_prepare(monkeypatch, field: str | tuple, run: bool = True) -> list:
    """A list that gains the named argument of every H.prepare call (by the signature's name,
    whatever its position; a tuple of names: a tuple of their values), the real prepare run
    after it or, with run=False, skipped (the launch then returns None)."""
    real = H.prepare
    names = list(inspect.signature(real.__wrapped__).parameters)
    seen = []

    def record(*args):
        bound = dict(zip(names, args, strict=True))
        seen.append(tuple(bound[f] for f in field) if isinstance(field, tuple) else bound[field])
        return real(*args) if run else False

    monkeypatch.setattr(H, "prepare", record)
    return seen


def test_the_launch_takes_the_process_split_size_unless_given_one(monkeypatch):
    """A caller that names no split size (the GPU tests' _wg) gets the process's, the size the
    mma.sync kernel reads (attention._plan): a wgmma kernel at the default size against an
    mma.sync kernel at another would differ in every row longer than the shorter split."""
    from bi_rl import _split

    sizes = _record_prepare(monkeypatch, "keys_per_split", run=False)
    q = mx.zeros((1, 2, 64, 64), mx.bfloat16)
    k = mx.zeros((1, 1, 64, 64), mx.bfloat16)
    monkeypatch.delenv(_split.SPLIT_ENV, raising=False)
    assert H.launch(q, k, k, 0.125, None, A.CAUSAL, 0) is None  # (prepare: not installed)
    for value in ("256", "1024"):
        monkeypatch.setenv(_split.SPLIT_ENV, value)
        H.launch(q, k, k, 0.125, None, A.CAUSAL, 0)
    H.launch(q, k, k, 0.125, None, A.CAUSAL, 0, keys_per_split=512)  # named: as named
    assert sizes == [512, 256, 1024, 512]


# ---- on a Hopper GPU ------------------------------------------------------------------------


def _qkv(b, hq, hkv, t, d, dtype, key):
    return (
        rand((b, hq, t, d), dtype, key),
        rand((b, hkv, t, d), dtype, key + 1),
        rand((b, hkv, t, d), dtype, key + 2),
    )


def _wg(q, k, v, scale, mask=None, kind=A.CAUSAL, window=0, nwg=None, pp=None, tma=None):
    out = H.launch(q, k, v, scale, mask, kind, window, nwg, pp=pp, tma=tma)
    assert out is not None, "MLX's kernel cache could not be written: the path did not run"
    return out


def _maps(q, k, v, scale, kind=A.CAUSAL, window=0) -> np.ndarray:
    """The scratch output of the ping-pong kernel with TMA copies on these arguments, launched
    as launch() launches it but zeroed first: tensor maps where its blocks copied by TMA,
    zeros where every block took the 16-byte copies."""
    fwd = H.plan(q, k, scale, None, kind, window, 2, pp=True, tma=True)
    _, maps = fwd(q, k, v, init_value=0, with_scratch=True)
    return np.array(maps)


# The kernel's schedules: one warpgroup a block, two in lockstep, two in ping-pong, two in
# ping-pong with their K/V copied by TMA.
SCHEDULES = [(1, False, False), (2, False, False), (2, True, False), (2, True, True)]


@on_hopper
@pytest.mark.parametrize("dtype", [mx.bfloat16, mx.float16])
@pytest.mark.parametrize("d", H.HEAD_DIMS)
@pytest.mark.parametrize("heads", [(16, 8), (4, 1)])
@pytest.mark.parametrize("t", [32, 33, 64, 65, 255, 256, 257, 511, 512, 513, 1000])
@pytest.mark.parametrize(("nwg", "pp", "tma"), SCHEDULES)
def test_causal_prefill_has_the_bits_of_the_mma_sync_kernel(dtype, d, heads, t, nwg, pp, tma):
    """Both sides of the 64-key block, the 256- and 512-key splits and the 64- / 128-row tile
    edges (t x 2 or 4 rows), one or two warpgroups a block, two in lockstep or ping-pong, the
    latter with cp.async or TMA copies."""
    hq, hkv = heads
    if t * (hq // hkv) < H.MIN_ROWS:
        pytest.skip("below the rows this path serves")
    q, k, v = _qkv(1, hq, hkv, t, d, dtype, 10 * t + d)
    scale = d**-0.5
    want = A.scaled_dot_product_attention(q, k, v, scale, "causal", config=SEQUENTIAL)
    got = _wg(q, k, v, scale, nwg=nwg, pp=pp, tma=tma)
    assert (bits(got) == bits(want)).all(), f"{int((bits(got) != bits(want)).sum())} differ"


@on_hopper
@pytest.mark.parametrize("d", H.HEAD_DIMS)
@pytest.mark.parametrize(("keys", "t"), [(256, 255), (256, 256), (256, 257), (1024, 1025)])
def test_other_split_sizes_keep_the_two_kernels_bit_for_bit(monkeypatch, keys, t, d):
    """BI_RL_ATTN_SPLIT's other sizes: at 256 and 1024 keys a split both sides of the split
    edge (t x 4 rows a kv head), the wgmma kernel against the mma.sync kernel, both at that
    size (fresh plans: a plan keeps the size it was built with); guard: the mma.sync plan's
    kernel and the wgmma kernel the launch prepares are both built for that size."""
    from bi_rl import _split
    from bi_rl.backends.cuda import _kernels

    monkeypatch.setenv(_split.SPLIT_ENV, str(keys))
    monkeypatch.setattr(A, "_PLANS", _kernels.Plans())
    prepared = _record_prepare(monkeypatch, "keys_per_split")
    q, k, v = _qkv(1, 4, 1, t, d, mx.bfloat16, t + d)
    scale = d**-0.5
    want = A.scaled_dot_product_attention(q, k, v, scale, "causal", config=SEQUENTIAL)
    ((fwd, _, planned),) = A._PLANS.values()
    assert fwd.spec.name.endswith(f"_k{keys}") and planned == keys
    got = _wg(q, k, v, scale)
    assert prepared == [keys]
    assert (bits(got) == bits(want)).all(), f"{int((bits(got) != bits(want)).sum())} differ"


@on_hopper
@pytest.mark.parametrize("dtype", [mx.bfloat16, mx.float16])
@pytest.mark.parametrize("kind", ["bool", "additive"])
def test_left_padded_batch_with_an_array_mask_matches_and_each_row_alone(dtype, kind):
    """Three sequences of 300 tokens left-padded by 0, 37 and 250: the mma.sync kernel's bits,
    and each sequence's rows the bits it has computed alone (unpadded, causal)."""
    b, hq, hkv, t, d = 3, 16, 8, 300, 128
    q, k, v = _qkv(b, hq, hkv, t, d, dtype, 7)
    pads = [0, 37, 250]
    i = mx.arange(t)[:, None]
    j = mx.arange(t)[None, :]
    ok = mx.stack([(j <= i) & (j >= p) for p in pads])[:, None]  # (b, 1, t, t)
    if kind == "bool":
        mask, mkind = ok, A.BOOL_MASK
    else:
        mask = mx.where(ok, mx.array(0.0, dtype), mx.array(-float("inf"), dtype))
        mkind = A.ADDITIVE
    scale = d**-0.5
    want = A.scaled_dot_product_attention(q, k, v, scale, mask, config=SEQUENTIAL)
    got = _wg(q, k, v, scale, mask, mkind)
    assert (bits(got) == bits(want)).all()
    for s, p in enumerate(pads):
        alone = _wg(q[s : s + 1, :, p:], k[s : s + 1, :, p:], v[s : s + 1, :, p:], scale)
        assert (bits(got[s, :, p:]) == bits(alone[0])).all(), f"sequence {s}, padding {p}"


@on_hopper
@pytest.mark.parametrize("layout", ["model", "strided", "unaligned"])
def test_q_k_v_read_in_place_in_any_layout_keep_the_bits(layout):
    """The kernel reads Q, K and V through their strides: 16 bytes at a time where the head dim
    is contiguous and every row starts 16-byte aligned ("model": (B, T, H, D) transposed, as
    attention layers pass them), element by element otherwise ("strided": every other column of
    a wider array; "unaligned": the last D of D + 1 values a row, so neither the rows' stride
    nor the first row's start is a multiple of 16 bytes). Each gives the bits of the same
    values made contiguous, and of the mma.sync kernel; 600 tokens cross the 64-key block and
    512-key split edges."""
    b, hq, hkv, t, d = 1, 16, 8, 600, 128
    key = {"model": 1, "strided": 2, "unaligned": 3}[layout]

    def make(h, k):
        if layout == "model":
            return rand((b, t, h, d), mx.bfloat16, k).transpose(0, 2, 1, 3)
        if layout == "strided":
            return rand((b, h, t, 2 * d), mx.bfloat16, k)[..., ::2]
        return rand((b, h, t, d + 1), mx.bfloat16, k)[..., 1:]

    # the launch hands MLX the views as they are (a row-contiguous spec would copy them first)
    assert not H.spec(False, d, 1).row_contiguous and not H.spec(False, d, 2).row_contiguous
    q, k, v = make(hq, key), make(hkv, key + 10), make(hkv, key + 20)
    dense = [mx.contiguous(x) for x in (q, k, v)]
    mx.eval(q, k, v, *dense)
    scale = d**-0.5
    got = _wg(q, k, v, scale)
    want = _wg(*dense, scale)
    assert (bits(got) == bits(want)).all(), f"{int((bits(got) != bits(want)).sum())} differ"
    ref = A.scaled_dot_product_attention(*dense, scale, "causal", config=SEQUENTIAL)
    assert (bits(got) == bits(ref)).all()


@on_hopper
@pytest.mark.parametrize("dtype", [mx.bfloat16, mx.float16])
@pytest.mark.parametrize("t", [65, 300, 1000])
def test_a_decode_row_has_the_bits_of_its_prefill_row(dtype, t):
    """The kernel alone, whichever MMA family the other kernel uses: query i decoded against
    keys 0..i (one query, two live rows of a 64-row block) gives the bits row i had in the
    causal prefill of all t tokens (many rows a block, other rows' keys beside it)."""
    q, k, v = _qkv(1, 16, 8, t, 128, dtype, t)
    scale = 128**-0.5
    full = _wg(q, k, v, scale)
    for i in (0, 63, 64, t // 2, t - 2, t - 1):
        one = _wg(q[:, :, i : i + 1], k[:, :, : i + 1], v[:, :, : i + 1], scale, nwg=1)
        assert (bits(one[:, :, 0]) == bits(full[:, :, i])).all(), f"query {i} of {t}"


@on_hopper
@pytest.mark.parametrize("tq,before", [(32, 300), (64, 512), (200, 300), (512, 512), (97, 1)])
@pytest.mark.parametrize("masked", [False, True])
def test_a_prefill_chunk_after_cached_keys_matches_the_mma_sync_kernel(tq, before, masked):
    """A later prefill chunk: tq queries at the end of tq + before keys (query i at position
    i + before), causal, or with a bool mask that also hides a left padding of 37 keys, as
    the engine's chunked prefill over a cache gives them."""
    tk = tq + before
    q, k, v = _qkv(1, 16, 8, tk, 128, mx.bfloat16, tq + before)
    q = q[:, :, before:]
    scale = 128**-0.5
    if masked:
        i = mx.arange(tq)[:, None] + before
        j = mx.arange(tk)[None, :]
        mask = ((j <= i) & (j >= 37))[None, None]
        want = A.scaled_dot_product_attention(q, k, v, scale, mask, config=SEQUENTIAL)
        got = _wg(q, k, v, scale, mask, A.BOOL_MASK)
    else:
        want = A.scaled_dot_product_attention(q, k, v, scale, "causal", config=SEQUENTIAL)
        got = _wg(q, k, v, scale)
    assert (bits(got) == bits(want)).all(), f"{int((bits(got) != bits(want)).sum())} differ"


@on_hopper
@pytest.mark.parametrize("window", [63, 64, 65, 256])
@pytest.mark.parametrize(("pp", "tma"), [(False, False), (True, False), (True, True)])
def test_window_argument_matches_the_mma_sync_kernel(window, pp, tma):
    """A window gives each row a first key of its own, so a block computes its rows in many
    passes (in the ping-pong schedule, the stage hand-offs carry their phases across them;
    with TMA a pass's full blocks and its partial last one are copied by different paths)."""
    q, k, v = _qkv(1, 16, 8, 600, 128, mx.bfloat16, window)
    scale = 128**-0.5
    want = A.scaled_dot_product_attention(
        q, k, v, scale, "causal", window=window, config=SEQUENTIAL
    )
    got = _wg(q, k, v, scale, window=window, nwg=2 if pp else None, pp=pp, tma=tma)
    assert (bits(got) == bits(want)).all()


@on_hopper
@pytest.mark.parametrize("d", H.HEAD_DIMS)
@pytest.mark.parametrize(("b", "t"), [(1, 4097), (3, 1500)])
def test_ping_pong_over_long_rows_and_batches_has_the_lockstep_bits(monkeypatch, d, b, t):
    """Many steps, splits and blocks a launch (4,097 tokens: a split edge and a block edge one
    key past; three sequences of 1,500 unmasked keys, no causality): the ping-pong schedule,
    with cp.async and with TMA copies, gives the lockstep kernel's bits, which the tests above
    tie to the mma.sync kernel. Guards: the launches prepared the three schedules, and the TMA
    one wrote its tensor maps (its copies ran, not only the 16-byte ones)."""
    schedules = _record_prepare(monkeypatch, ("pp", "tma"))
    q, k, v = _qkv(b, 16, 8, t, d, mx.bfloat16, b * t + d)
    scale = d**-0.5
    kind = A.CAUSAL if b == 1 else A.NO_MASK
    lock = _wg(q, k, v, scale, kind=kind, nwg=2, pp=False)
    ping = _wg(q, k, v, scale, kind=kind, nwg=2, pp=True, tma=False)
    fed = _wg(q, k, v, scale, kind=kind, nwg=2, pp=True, tma=True)
    assert schedules == [(False, False), (True, False), (True, True)]
    for name, got in (("ping-pong", ping), ("ping-pong with TMA", fed)):
        assert (bits(got) == bits(lock)).all(), f"{name}: {(bits(got) != bits(lock)).sum()} differ"
    assert _maps(q, k, v, scale, kind).any(), "no tensor map written: TMA did not copy"


def _count_launches(monkeypatch) -> list:
    """A list that gains an entry each time the public path launches the wgmma kernel."""
    calls = []
    real = H.launch
    monkeypatch.setattr(H, "launch", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    return calls


@on_hopper
def test_the_public_path_takes_the_kernel_unless_turned_off(monkeypatch):
    q, k, v = _qkv(1, 16, 8, 128, 128, mx.bfloat16, 3)
    calls = _count_launches(monkeypatch)
    monkeypatch.setenv(H.ENV, "0")
    off = A.scaled_dot_product_attention(q, k, v, 0.088, "causal")
    assert not calls
    monkeypatch.delenv(H.ENV)
    on = A.scaled_dot_product_attention(q, k, v, 0.088, "causal")
    assert calls == [1]
    assert (bits(on) == bits(off)).all()


@on_hopper
@pytest.mark.parametrize("form", ["no mask", "causal", "noted mask"])
def test_a_window_as_long_as_the_keys_keeps_the_kernel_and_its_bits(monkeypatch, form):
    """Through the public path, a window that leaves out no key (window = keys) is served by
    the wgmma kernel and one key shorter by the mma.sync kernel (guard: wgmma launches
    counted), each with the bits of the mma.sync kernel forced on the same arguments: the
    window given alone, with "causal", and folded into a bool mask noted with it (as the
    windowed KV caches note theirs, bi_rl._mask_window)."""
    t = 600
    q, k, v = _qkv(1, 16, 8, t, 128, mx.bfloat16, 21)
    scale = 128**-0.5
    calls = _count_launches(monkeypatch)
    for w, served in ((t, 1), (t - 1, 0)):
        if form == "noted mask":
            mask, window = window_mask(t, t, w), None
            mask_window.note(mask, w)
        else:
            mask, window = (None if form == "no mask" else "causal"), w
        before = len(calls)
        got = A.scaled_dot_product_attention(q, k, v, scale, mask, window=window)
        assert len(calls) - before == served, f"window {w} of {t} keys: which kernel"
        want = A.scaled_dot_product_attention(
            q, k, v, scale, mask, window=window, config=SEQUENTIAL
        )
        assert (bits(got) == bits(want)).all(), f"window {w} of {t} keys"


@on_hopper
@pytest.mark.parametrize("t", [31, 32, 63, 64])
def test_the_dispatch_edge_between_the_two_kernels_moves_no_bit(monkeypatch, t):
    """Through the public path, 62 / 64 rows a (batch, kv head) (the mma.sync kernel below 64,
    the wgmma one from 64) and 126 / 128 (one / two warpgroups): the bits of the mma.sync
    kernel forced, and the path under test is the one expected."""
    monkeypatch.delenv(H.ENV, raising=False)
    calls = _count_launches(monkeypatch)
    q, k, v = _qkv(2, 16, 8, t, 128, mx.bfloat16, t)
    scale = 128**-0.5
    got = A.scaled_dot_product_attention(q, k, v, scale, "causal")
    assert calls == ([1] if 2 * t >= H.MIN_ROWS else []), "the expected kernel did not run"
    want = A.scaled_dot_product_attention(q, k, v, scale, "causal", config=SEQUENTIAL)
    assert (bits(got) == bits(want)).all()


@has_nvrtc
@pytest.mark.parametrize("keys", [256, 1024])
def test_other_split_sizes_compile_clean(tmp_path, monkeypatch, keys):
    """The wgmma kernel at 256 and 1024 keys a split (BI_RL_ATTN_SPLIT's other sizes): no
    spills and no serialised wgmma, at both head dims, one and two warpgroups, bool mask."""
    monkeypatch.setenv(nvrtc.CACHE_ENV, str(tmp_path))
    for d in H.HEAD_DIMS:
        for nwg in (1, 2):
            sp = H.spec(True, d, nwg, keys)
            t = H.template(mx.bfloat16, d, A.BOOL_MASK, 0.088, 0, nwg)
            ins = [(mx.bfloat16, 4)] * 3 + [(mx.bool_, 4)]
            source = mlx_jit.render(sp, sp.header(), ins, [mx.bfloat16], t)
            assert f"#define BI_ATT_SPLIT {keys}" in source
            entry = "mlx::core::cu::" + mlx_jit.kernel_name(sp.name, t)
            built = nvrtc.compile_cubin(
                source, sp.name, "sm_90a", headers=mlx_jit.STAND_IN_HEADERS, names=(entry,)
            )
            what = f"attention d{d} x{nwg} split {keys}"
            assert not built.spills, f"{what} spills: {built.log}"
            assert not re.findall(r"C751[145]", built.log), f"{what}: serialised wgmma"
