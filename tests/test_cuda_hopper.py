"""Hopper (wgmma) GEMM and quantized GEMM: bi_rl/backends/cuda/{hopper,hopper_qmm,nvrtc,mlx_jit}.

On any machine: the dispatcher only picks listed configurations, every configuration fits in
shared memory, every kernel the dispatcher can pick compiles for sm_90a with no spills and no
serialised wgmma (where NVRTC is installed), MLX's module naming (libstdc++'s std::hash) is
reproduced, and the NVRTC cache never serves an entry for other source.

On a Hopper GPU: every configuration gives the same bits, a row alone equals the same row in
any batch (both sides of every tile edge), accuracy against float64 matches stock MLX's, MLX
renders the source bi-rl hashed (so the cubin bi-rl placed is the code that ran), and stock
MLX on the same inputs is the negative control.
"""

from __future__ import annotations

import itertools
import math
import os
import re
import shutil
import subprocess
from dataclasses import replace

import mlx.core as mx
import numpy as np
import pytest
from conftest import bits, f64, load_script, rand, relerr

from bi_rl.backends.cuda import gemm as cuda_gemm
from bi_rl.backends.cuda import hopper, hopper_qmm, mlx_jit, nvrtc
from bi_rl.backends.cuda._kernels import Launch

on_hopper = pytest.mark.skipif(not hopper.available(), reason="needs a Hopper GPU and NVRTC")
has_nvrtc = pytest.mark.skipif(nvrtc.nvrtc_module() is None, reason="needs cuda-bindings")

HALF_TYPES = (mx.bfloat16, mx.float16)
MS = (1, 7, 8, 9, 63, 64, 65, 127, 128, 129, 255, 256, 257)
SHAPES = [(64, 40), (72, 264), (100, 37), (2048, 512)]  # (K, N): tails in K and N, K % 8 != 0


# ---- any machine ----------------------------------------------------------------------------


@pytest.mark.parametrize("m", [1, 8, 17, 64, 65, 128, 129, 512, 4096, 16384])
@pytest.mark.parametrize("n", [40, 1024, 2048, 6144, 151936])
@pytest.mark.parametrize("fill", ["", "0", "1"])
def test_the_dispatcher_picks_only_listed_configurations(monkeypatch, m, n, fill):
    monkeypatch.setenv(hopper.FILL_ENV, fill)
    assert hopper.choose_config(m, n, 2048) in hopper.configs()
    for b in hopper_qmm.BITS:
        assert hopper_qmm.choose_config(m, n, 2048, b) in hopper_qmm.configs(b)


@pytest.mark.parametrize("n", [40, 2048, 6144, 151936])
def test_dense_dispatch_switches_to_the_prefill_tile_past_64_rows(monkeypatch, n):
    """With the block-shape rule off (BI_RL_HOPPER_FILL=0): up to 16 rows the few-row kernel,
    then up to 64 rows one warpgroup of 128 columns (decode) at every N; from 65 rows the
    128 x 256 tile with its loads a stage further ahead and its epilogue through shared memory
    at every M. By default (or BI_RL_HOPPER_FILL=1) that tile wherever its blocks fill the
    machine, one warpgroup up to 64 rows."""
    monkeypatch.delenv(hopper.DECODE_ENV, raising=False)
    monkeypatch.setenv(hopper.FILL_ENV, "0")
    for m in (1, 8, 16):
        assert hopper.choose_config(m, n, 2048).narrow, m
    for m in (17, 63, 64):
        assert hopper.choose_config(m, n, 2048) == hopper.DECODE, m
    assert (hopper.DECODE.nwg, hopper.DECODE.bn, hopper.DECODE.rt) == (1, 128, 64)
    for m in (65, 128, 129, 512, 4096, 16384):
        assert hopper.choose_config(m, n, 2048) == hopper.PREFILL_DEEP_STAGED, m
    assert (hopper.PREFILL.rt, hopper.PREFILL.bn) == (128, 256)
    for fill in ("", "1"):
        monkeypatch.setenv(hopper.FILL_ENV, fill)
        for m in (1, 8, 16):
            assert hopper.choose_config(m, n, 2048).narrow, m
        for m in (17, 63, 64):
            cfg = hopper.choose_config(m, n, 2048)
            assert (cfg.nwg, cfg.rt) == (1, 64) and cfg in hopper.DECODE_WIDTHS, m
        big = [m for m in (65, 128, 129, 512, 4096, 16384) if hopper.PREFILL.blocks(m, n) >= 93]
        for m in big:
            assert hopper.choose_config(m, n, 2048) == hopper.PREFILL_DEEP_STAGED, m
        assert 16384 in big


def test_block_shapes_follow_the_output_so_that_blocks_fill_the_machine(monkeypatch):
    """By default, the widest candidate whose blocks reach FILL (70%) of the 132
    multiprocessors, i.e. 93 blocks, else the narrowest: both sides of each turning point, at
    17-64 rows among the one-warpgroup widths and past 64 rows among 128 x 256, 128 x 128 and
    64 x 128 blocks. BI_RL_HOPPER_FILL=1 is the same, 0 one shape per row range, any other
    value refused naming the variable."""
    monkeypatch.delenv(hopper.DECODE_ENV, raising=False)
    monkeypatch.delenv(hopper.FILL_ENV, raising=False)
    assert math.ceil(hopper.FILL * hopper.SMS) == 93

    def shape(m, n):
        cfg = hopper.choose_config(m, n, 2048)
        return cfg.rt, cfg.bn

    # 17-64 rows: 128 columns from 93 blocks (11904 columns), 64 from 93 x 64, 32 from 93 x 32
    for m in (17, 64):
        assert shape(m, 93 * 128) == (64, 128) and shape(m, 92 * 128) == (64, 64)
        assert shape(m, 93 * 64) == (64, 64) and shape(m, 92 * 64) == (64, 32)
        assert shape(m, 93 * 32) == (64, 32) and shape(m, 92 * 32) == (64, 16)
        assert shape(m, 2048) == (64, 16) and shape(m, 4096) == (64, 32)
        assert shape(m, 151936) == (64, 128)
    # past 64 rows: 128 x 256 blocks from 93 of them, then 128 x 128, then DECODE's 64 x 128
    assert shape(65, 93 * 256) == (128, 256) and shape(65, 92 * 256) == (128, 128)
    assert shape(65, 93 * 128) == (128, 128) and shape(65, 92 * 128) == (64, 128)
    assert shape(128, 2048) == (64, 128) and shape(129, 2048) == (64, 128)
    assert shape(1024, 2048) == (128, 128) and shape(2048, 2048) == (128, 256)
    assert shape(512, 6144) == (128, 256) and shape(256, 6144) == (128, 128)
    assert hopper.choose_config(65, 2048, 2048) == hopper.DECODE
    assert hopper.choose_config(1024, 2048, 2048) == hopper.MIDDLE
    assert hopper.MIDDLE in hopper.configs() and hopper.MIDDLE.deep
    # the deep and staged switches still name the wide blocks' kernel
    monkeypatch.setenv(hopper.STAGED_ENV, "0")
    assert hopper.choose_config(2048, 2048, 2048) == hopper.PREFILL_DEEP
    monkeypatch.setenv(hopper.FILL_ENV, "1")
    assert hopper.choose_config(1024, 2048, 2048) == hopper.MIDDLE
    monkeypatch.setenv(hopper.FILL_ENV, "0")
    assert hopper.choose_config(64, 2048, 2048) == hopper.DECODE
    assert hopper.choose_config(1024, 2048, 2048) == hopper.PREFILL_DEEP
    for bad in ("yes", "2", "true"):
        monkeypatch.setenv(hopper.FILL_ENV, bad)
        with pytest.raises(ValueError, match=hopper.FILL_ENV):
            hopper.choose_config(1024, 2048, 2048)


def test_the_deeper_pipeline_is_the_default_and_its_own_kernel(monkeypatch):
    """Rows past 64 take the deeper pipeline (decode rows keep theirs), BI_RL_HOPPER_DEEP=0
    the two-ahead one, with or without the staged epilogue (BI_RL_HOPPER_STAGED=0): the same
    blocks and shared memory, PREFILL_DEEP compiled as gemm<..., DEEP = true> under its own
    name."""
    d = hopper.PREFILL_DEEP
    assert (d.rt, d.bn, d.nwg, d.stages, d.deep) == (128, 256, 2, 4, True)
    assert d.shared_memory == hopper.PREFILL.shared_memory and not hopper.PREFILL.deep
    monkeypatch.delenv(hopper.DEEP_ENV, raising=False)
    monkeypatch.delenv(hopper.STAGED_ENV, raising=False)
    monkeypatch.delenv(hopper.FILL_ENV, raising=False)
    ds = hopper.PREFILL_DEEP_STAGED
    assert hopper.choose_config(4096, 2048, 2048) == ds == hopper.choose_config(16384, 151936, 2048)
    monkeypatch.setenv(hopper.FILL_ENV, "0")  # the 128 x 256 blocks at every M past 64 rows
    assert hopper.choose_config(65, 2048, 2048) == ds
    assert not hopper.choose_config(64, 2048, 2048).staged
    assert (
        not hopper.choose_config(64, 2048, 2048).deep and not hopper.choose_config(1, 64, 64).deep
    )
    monkeypatch.setenv(hopper.STAGED_ENV, "0")
    assert hopper.choose_config(4096, 2048, 2048) == d
    monkeypatch.setenv(hopper.DEEP_ENV, "0")
    assert hopper.choose_config(4096, 2048, 2048) == hopper.PREFILL
    monkeypatch.delenv(hopper.STAGED_ENV)
    assert hopper.choose_config(4096, 2048, 2048) == hopper.PREFILL_STAGED
    for nd in (False, True):
        sp, plain = hopper.cfg_spec(d, False, nd), hopper.cfg_spec(hopper.PREFILL, False, nd)
        assert sp.name == plain.name + "_d" and "HAS_C, true>(" in sp.source
        assert "true>(" not in plain.source and plain.shared_memory == sp.shared_memory


def test_the_decode_width_can_be_named_for_timing_and_nothing_else(monkeypatch):
    """BI_RL_HOPPER_DECODE_COLUMNS picks the one-warpgroup width of 17-64 rows among configs()
    (so the GPU tests cover its bits); rows up to 16 and past 64 keep their kernels; any other
    value is refused naming the variable."""
    monkeypatch.delenv(hopper.DECODE_ENV, raising=False)
    monkeypatch.setenv(hopper.FILL_ENV, "0")  # one width for 17-64 rows: DECODE's
    assert hopper.choose_config(17, 2048, 2048) == hopper.DECODE
    for width in (16, 32, 64, 128, 256):
        monkeypatch.setenv(hopper.DECODE_ENV, str(width))
        for m in (17, 33, 64):
            cfg = hopper.choose_config(m, 2048, 2048)
            assert (cfg.bn, cfg.nwg, cfg.rt) == (width, 1, 64) and cfg in hopper.configs()
        assert hopper.choose_config(65, 2048, 2048) == hopper.prefill_config()
        if hopper.narrow_enabled():
            assert hopper.choose_config(16, 2048, 2048).narrow
    for bad in ("48", "wide", "0"):
        monkeypatch.setenv(hopper.DECODE_ENV, bad)
        with pytest.raises(ValueError, match=hopper.DECODE_ENV):
            hopper.choose_config(32, 2048, 2048)


@pytest.mark.parametrize("m", [1, 7, 8, 9, 16, 17, 32, 33, 63, 64, 65])
def test_quantized_decode_blocks_are_narrow_and_hold_m(monkeypatch, m):
    """With the few-row kernel off, up to 64 rows: the row tile that holds M, 16 columns (4
    k-tiles a stage when the tile is 8 rows), 32 where 16 would cut N into more than
    DECODE_BLOCKS blocks; but for weights of 4 bits or fewer at 17-64 rows 64 columns up to a
    32-row tile and 32 at 64 rows, vocabularies too; past 64 rows the wide blocks."""
    monkeypatch.setenv(hopper.NARROW_ENV, "0")
    for b in hopper_qmm.BITS:
        narrow = hopper_qmm.choose_config(m, 6144, 2048, b)
        wide_n = hopper_qmm.choose_config(m, 151936, 2048, b)
        assert not narrow.narrow and not wide_n.narrow
        if m > 64:
            assert narrow.rt >= 64 and narrow.kt == 1 and narrow.bn >= 64
            continue
        rt = 8 if m <= 8 else 16 if m <= 16 else 32 if m <= 32 else 64
        if rt >= 32 and b <= 4:
            bn = 64 if rt == 32 else 32
            assert (narrow.rt, narrow.bn, narrow.kt) == (rt, bn, 1), (m, b)
            assert (wide_n.rt, wide_n.bn, wide_n.kt) == (rt, bn, 1), (m, b)
            continue
        assert (narrow.rt, narrow.bn, narrow.kt) == (rt, 16, 4 if rt == 8 else 1)
        assert (wide_n.rt, wide_n.bn, wide_n.kt) == (rt, 32, 1)
    n_edge = 16 * hopper_qmm.DECODE_BLOCKS
    assert hopper_qmm.choose_config(1, n_edge, 2048, 4).bn == 16
    assert hopper_qmm.choose_config(1, n_edge + 1, 2048, 4).bn == 32


def test_the_few_row_quantized_kernel_serves_decode_rows_unless_turned_off(monkeypatch):
    """Up to 16 rows the quantized mma.sync kernel: the widest four-warp configuration that
    still gives every multiprocessor a block, else 16-column blocks, warp-specialised for a
    single launch (BI_RL_HOPPER_WS=0: two-warp blocks), two-warp ones for a grouped launch
    (the warp-specialised kernel has no grouped entry); 17 rows and more, or
    BI_RL_HOPPER_NARROW=0, the wgmma configurations."""
    monkeypatch.delenv(hopper.NARROW_ENV, raising=False)
    monkeypatch.delenv(hopper_qmm.WS_ENV, raising=False)
    for b in hopper_qmm.BITS:
        spread = hopper_qmm.QNarrowConfig(1, 2, 12, bits=b)
        ws = hopper_qmm.QNarrowWsConfig(1, 2, 16, bits=b, helpers=4, slots=4)
        assert hopper_qmm.ws_spread(b) == ws and ws in hopper_qmm.configs(b)
        for m in (1, 8, 15, 16):
            assert hopper_qmm.choose_config(m, 2048, 2048, b) == ws  # 64 columns: 32 blocks
            want = hopper_qmm.QNarrowConfig(4, 4, 4, bits=b)
            assert hopper_qmm.choose_config(m, 151936, 2048, b) == want
            assert hopper_qmm.group_config(m, (2048, 1024, 1024), b) == spread
        edge = 64 * (hopper.SMS - 1)  # 64-column blocks: one short of a block per multiprocessor
        assert hopper_qmm.choose_config(1, edge, 2048, b) == ws
        assert hopper_qmm.choose_config(1, edge + 1, 2048, b).bn == 64
        edge = 128 * (hopper.SMS - 1)
        assert hopper_qmm.choose_config(1, edge, 2048, b).bn == 64
        assert hopper_qmm.choose_config(1, edge + 1, 2048, b).bn == 128
        assert not hopper_qmm.choose_config(17, 2048, 2048, b).narrow
        assert not hopper_qmm.group_config(17, (2048, 1024, 1024), b).narrow
        unpicked = hopper_qmm.QNarrowConfig(*hopper_qmm.NARROW_UNPICKED, bits=b)
        assert unpicked in hopper_qmm.variants(b) and unpicked not in hopper_qmm.configs(b)
        assert set(hopper_qmm.narrow_configs(b)) <= set(hopper_qmm.decode_configs(b))
    monkeypatch.setenv(hopper_qmm.WS_ENV, "0")
    assert hopper_qmm.choose_config(1, 2048, 2048, 4) == hopper_qmm.QNarrowConfig(1, 2, 12, bits=4)
    monkeypatch.setenv(hopper.NARROW_ENV, "0")
    assert not hopper_qmm.choose_config(1, 2048, 2048, 4).narrow
    assert not hopper_qmm.group_config(1, (2048, 1024, 1024), 4).narrow


def test_the_grouped_quantized_entry_takes_no_warp_specialised_configuration(monkeypatch):
    """The grouped entry runs the plain few-row body: `group_config` picks among
    `group_configs` (every decode configuration but the warp-specialised one) at every row
    count it serves and every width, and `prepare_group` refuses the warp-specialised one
    before compiling anything (its extra warps would run the plain body on other columns)."""
    monkeypatch.delenv(hopper.NARROW_ENV, raising=False)
    monkeypatch.delenv(hopper_qmm.WS_ENV, raising=False)
    for b in hopper_qmm.BITS:
        allowed = set(hopper_qmm.group_configs(b))
        assert hopper_qmm.ws_spread(b) not in allowed
        assert allowed | {hopper_qmm.ws_spread(b)} == set(hopper_qmm.decode_configs(b))
        for m in (1, 8, 16, 17, 33, 64):
            for widths in ((2048, 1024, 1024), (6144, 6144), (72, 40, 24), (151936, 8)):
                assert hopper_qmm.group_config(m, widths, b) in allowed, (m, widths, b)
        hopper_qmm.prepare_group.cache_clear()
        with pytest.raises(ValueError, match="no warp-specialised form"):
            hopper_qmm.prepare_group(mx.bfloat16, hopper_qmm.ws_spread(b), 2)


def test_few_row_quantized_shared_memory_is_the_kernel_formula():
    """The Python side's bytes are the kernel's: x's 16 x 64 tile, then QuantB's one-k-tile
    stage (BITS bytes a value group and 16 of scales and biases a row, rounded to 1024)."""
    from bi_rl._source import kernel_source

    src = kernel_source("cuda/hopper/qmm_narrow.cu")
    assert "return 1024 + STAGES * QmmNarrow<BITS, NT, WARPS>::STAGE_BYTES;" in src
    assert "static constexpr int STAGE_BYTES = A_BYTES + QB::STAGE_BYTES;" in src
    qmm_src = kernel_source("cuda/hopper/qmm.cu")
    assert "STAGE_BYTES = (KT * (W_BYTES + SB_BYTES) + 1023) / 1024 * 1024;" in qmm_src
    for b in hopper_qmm.BITS:
        for cfg in hopper_qmm.variants(b):
            if not cfg.narrow or cfg.helpers:  # the warp-specialised ones: their own test
                continue
            packed = cfg.bn * 8 * b + cfg.bn * 16
            assert cfg.shared_memory == 1024 + cfg.stages * (2048 + -(-packed // 1024) * 1024)
            assert cfg.bn == 8 * cfg.nt * cfg.warps and cfg.threads == 32 * cfg.warps
        with pytest.raises(ValueError, match="even number of warps"):
            hopper_qmm.QNarrowConfig(1, 1, 12, bits=b)
        with pytest.raises(ValueError, match="3 stages or more"):
            hopper_qmm.QNarrowConfig(1, 2, 2, bits=b)


def test_the_warp_specialised_few_row_configurations_are_checked():
    """The warp-specialised few-row kernel's configurations: in variants() (so the GPU tests
    compare them), the first in configs() (the dispatcher's 16-column blocks); shared memory
    the kernel's formula (the stages of QNarrowConfig, then a slot of 128 bytes a column and
    two 8-byte barriers a slot); and shapes the kernel's static_asserts refuse are refused
    here first."""
    from bi_rl._source import kernel_source

    src = kernel_source("cuda/hopper/qmm_narrow_ws.cu")
    assert "return 1024 + STAGES * L::STAGE_BYTES + DQS * L::SLOT_BYTES + 16 * DQS;" in src
    assert "static constexpr int SLOT_BYTES = BNB * 128;" in src
    for b in hopper_qmm.BITS:
        for cfg in hopper_qmm.ws_configs(b):
            stage = 2048 + -(-cfg.bn * (8 * b + 16) // 1024) * 1024
            assert cfg.stage_bytes == stage
            assert cfg.shared_memory == 1024 + cfg.stages * stage + cfg.slots * (cfg.bn * 128 + 16)
            assert cfg.threads == 32 * (cfg.warps + cfg.helpers)
            assert cfg in hopper_qmm.variants(b)
            assert (cfg in hopper_qmm.configs(b)) == (cfg == hopper_qmm.ws_spread(b))
            assert hopper_qmm.cfg_spec(cfg).name == "bi_hopper_qmm_ws"
        with pytest.raises(ValueError, match="whole turns"):
            hopper_qmm.QNarrowWsConfig(1, 2, 14, bits=b, helpers=4)
        with pytest.raises(ValueError, match="a turn past its slots"):
            hopper_qmm.QNarrowWsConfig(1, 2, 8, bits=b, helpers=4, slots=8)
    assert len(hopper_qmm.variants(4)) == len(set(hopper_qmm.variants(4)))


def test_the_few_row_kernel_serves_decode_rows_unless_turned_off(monkeypatch):
    """Up to 16 rows the mma.sync kernel: the widest four-warp configuration that still gives
    every multiprocessor a block, else two-warp blocks of 16 columns; 17 rows and more,
    BI_RL_HOPPER_NARROW=0, or the precompiled launch path, the wgmma configurations."""
    monkeypatch.setenv(hopper.NARROW_ENV, "0")
    assert not any(hopper.choose_config(m, 2048, 2048).narrow for m in (1, 16))
    monkeypatch.delenv(hopper.NARROW_ENV, raising=False)
    two_warps = hopper.NarrowConfig(1, 2, 12)
    for m in (1, 8, 15, 16):
        assert hopper.choose_config(m, 2048, 2048) == two_warps  # 64 columns: 32 blocks
        assert hopper.choose_config(m, 151936, 2048) == hopper.NarrowConfig(4, 4, 4)
    assert hopper.choose_config(1, 1024, 2048) == two_warps
    assert hopper.choose_config(1, 6144, 2048) == two_warps  # 64 columns: 96 blocks
    assert hopper.choose_config(1, 14336, 4096) == hopper.NarrowConfig(2, 4, 6)  # 224 blocks
    edge = 64 * (hopper.SMS - 1)  # 64-column blocks: one short of a block per multiprocessor
    assert hopper.choose_config(1, edge + 1, 2048) == hopper.NarrowConfig(2, 4, 6)
    assert hopper.choose_config(1, edge, 2048) == two_warps
    edge = 128 * (hopper.SMS - 1)
    assert hopper.choose_config(1, edge + 1, 2048) == hopper.NarrowConfig(4, 4, 4)
    assert hopper.choose_config(1, edge, 2048) == hopper.NarrowConfig(2, 4, 6)
    assert hopper.NARROW_UNPICKED not in hopper.configs()
    assert not hopper.choose_config(17, 2048, 2048).narrow
    monkeypatch.setenv(hopper.ENV, "precompiled")
    assert not hopper.choose_config(1, 2048, 2048).narrow
    with pytest.raises(hopper.Unsupported):
        hopper.precompiled_cubin(mx.bfloat16, hopper.NARROW[0], False)


def test_few_row_shared_memory_is_the_kernel_formula():
    from bi_rl._source import kernel_source

    src = kernel_source("cuda/hopper/gemm_narrow.cu")
    assert "return 1024 + STAGES * (16 * 128 + 8 * NT * WARPS * 128);" in src
    for cfg in (*hopper.NARROW, hopper.NARROW_UNPICKED):
        assert cfg.shared_memory == 1024 + cfg.stages * (16 + cfg.bn) * 128
        assert cfg.bn == 8 * cfg.nt * cfg.warps and cfg.threads == 32 * cfg.warps
        assert cfg in hopper.variants()
        assert (cfg in hopper.configs()) == (cfg in hopper.NARROW)


def test_every_configuration_fits_in_shared_memory():
    for cfg in hopper.variants():
        assert cfg.stages >= 3 and cfg.shared_memory <= hopper.MAX_SHARED, cfg
    for b in hopper_qmm.BITS:
        for cfg in hopper_qmm.variants(b):
            assert cfg.stages >= 3 and cfg.shared_memory <= hopper.MAX_SHARED, cfg


def test_std_hash_is_libstdcxx():
    """MLX names a kernel's module by std::hash of its source; bi-rl must compute the same."""
    known = {b"": 0x553E93901E462A6E, b"abcdefghi": 0xB4EC9257851C8AAF}
    for data, h in known.items():
        assert mlx_jit.std_hash(data) == h
    gxx = shutil.which("g++")
    if gxx is None:
        return
    words = [b"mlx::core::cu::custom_kernel_x", bytes(range(1, 200)), b"x" * 1001]
    prog = (
        "#include <string>\n#include <cstdio>\n#include <functional>\n#include <iostream>\n"
        "int main(){std::string s; while(std::getline(std::cin,s))"
        'printf("%zx\\n", std::hash<std::string>{}(s));}'
    )
    exe = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"bi_rl_hash_{os.getpid()}")
    r = subprocess.run([gxx, "-x", "c++", "-O1", "-o", exe, "-"], input=prog.encode())
    if r.returncode != 0:
        pytest.skip("g++ could not build the reference")
    try:
        data = [w.replace(b"\n", b" ") for w in words]
        out = subprocess.run([exe], input=b"\n".join(data) + b"\n", capture_output=True)
        expect = [int(x, 16) for x in out.stdout.split()]
        assert [mlx_jit.std_hash(d) for d in data] == expect
    finally:
        os.unlink(exe)


def test_render_is_mlx_build_kernel_layout():
    sp = hopper.spec(True, 1024)
    t = hopper.template(mx.bfloat16, hopper.configs()[0], True, 1.0, 0.5)
    src = mlx_jit.render(sp, "HEADER\n", [(mx.bfloat16, 2)] * 3, [mx.bfloat16], t)
    name = mlx_jit.kernel_name(sp.name, t)
    assert src.startswith(mlx_jit.DEFAULT_HEADER + "HEADER\nnamespace mlx::core::cu {\n")
    assert f"__global__ void {name}(\n    const __nv_bfloat16* a,\n" in src
    assert "    const __grid_constant__ Strides c_strides,\n    __nv_bfloat16* out) {\n" in src
    assert "c_shape" not in src  # only what the body names is passed
    assert src.endswith(sp.source + "\n}\n\n} // namespace mlx::core::cu\n")
    assert name.startswith("custom_kernel_bi_hopper_gemm_c_f_16_1_")


def _compile(sp, tmpl, inputs, dtype):
    """dtype: the output's, or a tuple of each output's (hopper.out_dtypes)."""
    outs = list(dtype) if isinstance(dtype, tuple) else [dtype]
    source = mlx_jit.render(sp, sp.header(), inputs, outs, tmpl)
    entry = "mlx::core::cu::" + mlx_jit.kernel_name(sp.name, tmpl)
    return nvrtc.compile_cubin(
        source, sp.name, "sm_90a", headers=mlx_jit.STAND_IN_HEADERS, names=(entry,)
    )


def _assert_clean(built, what):
    assert not built.spills, f"{what} spills: {built.log}"
    assert "C7515" not in built.log, f"{what}: ptxas serialises its wgmma: {built.log}"
    assert built.cubin.startswith(b"\x7fELF")


def test_the_staged_epilogue_is_its_own_kernel_and_fits_in_the_stages():
    """PREFILL_STAGED and PREFILL_DEEP_STAGED are PREFILL's blocks with the epilogue through
    shared memory: their own kernel names and template call, in configs() (so every bitwise
    comparison covers them); the staged tile (rows of 2 BN + 16 bytes) fits in the stages it
    reuses, and a block without 64 rows a warpgroup is refused."""
    for cfg, deep in ((hopper.PREFILL_STAGED, False), (hopper.PREFILL_DEEP_STAGED, True)):
        assert (cfg.bn, cfg.nwg, cfg.stages, cfg.deep, cfg.staged) == (256, 2, 4, deep, True)
        assert cfg.shared_memory == hopper.PREFILL.shared_memory
        assert cfg.rt * (2 * cfg.bn + 16) <= cfg.stages * cfg.stage_bytes
        assert cfg in hopper.configs()
        for has_c, nd in ((False, False), (True, False), (False, True)):
            sp = hopper.cfg_spec(cfg, has_c, nd)
            assert sp.name.endswith("_d_s" if deep else "_s") and "_d_s" not in sp.name[:-4]
            call = f"HAS_C, {'true' if deep else 'false'}, true>("
            assert call in sp.source, sp.source
    assert not hopper.PREFILL_DEEP.staged and not hopper.NARROW[0].staged
    with pytest.raises(ValueError, match="64 rows a warpgroup"):
        hopper.HopperConfig(64, 1, 4, rt=32, staged=True)
    # one stage of 48 KiB cannot hold the 128 staged rows of 2 x 256 + 16 bytes
    with pytest.raises(ValueError, match="staged tile does not fit"):
        hopper.HopperConfig(256, 2, 1, staged=True)


@has_nvrtc
def test_the_staged_kernels_compile_clean_and_store_whole_rows(tmp_path, monkeypatch):
    """The staged kernels compile for sm_90a with no spills and no serialised wgmma, and their
    SASS holds 16-byte global stores (the rows copied out of shared memory), which the
    unstaged kernel's epilogue, 4 bytes a store, does not (where cuobjdump is installed)."""
    monkeypatch.setenv(nvrtc.CACHE_ENV, str(tmp_path))
    hopper_sass = load_script("tools/hopper_sass.py")
    try:
        tool = hopper_sass.cuobjdump()
    except SystemExit:
        tool = None
    for cfg in (hopper.PREFILL_STAGED, hopper.PREFILL_DEEP_STAGED, hopper.PREFILL_DEEP):
        for has_c in (False, True):
            sp = hopper.cfg_spec(cfg, has_c)
            t = hopper.template(mx.bfloat16, cfg, has_c, 1.0, 1.0)
            ins = [(mx.bfloat16, 2)] * len(sp.inputs)
            _assert_clean(_compile(sp, t, ins, mx.bfloat16), f"gemm {cfg} c={has_c}")
            if tool is None:
                continue
            sass, _ = hopper_sass.sass_of(sp, t, ins, mx.bfloat16, tool)
            wide = "STG.E.128" in sass
            assert wide == cfg.staged, f"{cfg} c={has_c}: 16-byte stores {wide}"


def test_the_tma_configuration_is_its_own_kernel_with_a_scratch_output():
    """PREFILL_TMA is PREFILL_DEEP_STAGED's blocks copied by TMA (gemm_tma.cu): its own kernel
    name and call, a warp more a block, the maps and mbarriers past the stages in shared
    memory (gemm_tma_smem), a second output `maps` of 256 bytes a block and 128 more, in
    configs() (so the GPU tests' bitwise comparison of every configuration covers it);
    configurations its fallback (gemm.cu's deep loop, one k-tile a stage, 64 rows a
    warpgroup) cannot serve are refused."""
    cfg = hopper.PREFILL_TMA
    assert cfg in hopper.configs() and cfg == replace(hopper.PREFILL_DEEP_STAGED, tma=True)
    assert cfg.threads == 288 and hopper.PREFILL_DEEP_STAGED.threads == 256
    assert cfg.shared_memory == 1024 + 4 * (128 + 256) * 128 + 256 + 16 * 4 == 197_952
    assert cfg.shared_memory <= hopper.MAX_SHARED
    assert cfg.scratch_words(4096, 2048) == 64 * 32 * 8 + 32
    assert hopper.PREFILL_DEEP_STAGED.scratch_words(4096, 2048) == 0
    assert hopper.out_dtypes(cfg, mx.float16) == (mx.float16, mx.uint32)
    assert hopper.out_dtypes(hopper.PREFILL_DEEP_STAGED, mx.float16) == (mx.float16,)
    for has_c, nd in ((False, False), (True, False), (False, True)):
        sp = hopper.cfg_spec(cfg, has_c, nd)
        assert sp.name.endswith("_ts") and sp.outputs == ("out", "maps")
        assert sp.files[-2:] == ("cuda/hopper/tma.cuh", "cuda/hopper/gemm_tma.cu")
        assert "bih::gemm_tma<F16, BN, NWG, STAGES, HAS_C, true>(A, B," in sp.source
        assert sp.source.rstrip().endswith("reinterpret_cast<unsigned char*>(maps));")
        assert "bih::gemm<" not in sp.source
    unstaged = hopper.cfg_spec(replace(cfg, staged=False), False)
    assert unstaged.name.endswith("_t") and "HAS_C, false>(" in unstaged.source
    for bad in (dict(deep=False), dict(kt=2), dict(nwg=1, bn=128, staged=False, rt=32)):
        fields = dict(bn=256, nwg=2, stages=4, deep=True, staged=True, tma=True) | bad
        with pytest.raises(ValueError, match="TMA copies need"):
            hopper.HopperConfig(**fields)


def test_tma_copies_past_64_rows_only_where_turned_on(monkeypatch):
    """BI_RL_HOPPER_TMA=1 makes the configuration past 64 rows PREFILL_TMA where 128 x 256
    blocks fill the machine and its loads run deep (TMA's fallback is the deep loop); unset or
    0 it is PREFILL_DEEP_STAGED as before; any other value is refused naming the variable."""
    assert hopper.choose_config(4096, 4096, 4096) == hopper.PREFILL_DEEP_STAGED
    monkeypatch.setenv(hopper.TMA_ENV, "1")
    assert hopper.choose_config(4096, 4096, 4096) == hopper.PREFILL_TMA
    assert hopper.choose_config(64, 4096, 4096) == hopper.decode_config(64, 4096)
    assert not hopper.choose_config(128, 2048, 2048).tma  # 64 x 128 blocks fill it there
    assert hopper.choose_config(1024, 2048, 2048) == hopper.MIDDLE_TMA  # 128 x 128 there
    assert replace(hopper.MIDDLE, tma=True) == hopper.MIDDLE_TMA
    assert hopper.MIDDLE_TMA.threads == 288
    assert hopper.MIDDLE_TMA in hopper.configs()
    monkeypatch.setenv(hopper.DEEP_ENV, "0")
    assert hopper.choose_config(4096, 4096, 4096) == hopper.PREFILL_STAGED
    monkeypatch.delenv(hopper.DEEP_ENV)
    monkeypatch.setenv(hopper.TMA_ENV, "0")
    assert hopper.choose_config(4096, 4096, 4096) == hopper.PREFILL_DEEP_STAGED
    assert hopper.choose_config(1024, 2048, 2048) == hopper.MIDDLE
    monkeypatch.setenv(hopper.TMA_ENV, "yes")
    with pytest.raises(ValueError, match="BI_RL_HOPPER_TMA must be 0 or 1"):
        hopper.check_settings()


def test_a_launch_with_scratch_passes_both_outputs_and_returns_the_first():
    """Launch.scratch: a second output the kernel writes for itself (the TMA GEMM's maps):
    requested with its shape and dtype in the same call, returned only when asked for."""
    seen = {}

    def stand_in(**kw):
        seen.update(kw)
        shapes, dtypes = kw["output_shapes"], kw["output_dtypes"]
        return [mx.zeros(s, d) for s, d in zip(shapes, dtypes, strict=True)]

    launch = Launch(
        kernel=stand_in,
        template=[],
        grid=(288, 1, 1),
        group=(288, 1, 1),
        out_shape=(4, 6),
        out_dtype=mx.float16,
        out_view=(2, 2, 6),
        scratch=((96,), mx.uint32),
    )
    out = launch(mx.zeros((4, 8)), mx.zeros((6, 8)))
    assert seen["output_shapes"] == [(4, 6), (96,)]
    assert seen["output_dtypes"] == [mx.float16, mx.uint32]
    assert out.shape == (2, 2, 6) and out.dtype == mx.float16
    out, scratch = launch(mx.zeros((4, 8)), mx.zeros((6, 8)), with_scratch=True)  # tests' view
    assert out.shape == (2, 2, 6) and scratch.shape == (96,) and scratch.dtype == mx.uint32


@has_nvrtc
def test_the_tma_kernels_compile_clean(tmp_path, monkeypatch):
    """PREFILL_TMA's and MIDDLE_TMA's kernels as MLX renders them (the maps output a uint32
    pointer) compile for sm_90a with no spills and no serialised wgmma: bf16 and f16, with and
    without c, and the rank-free entry. And they can launch: MLX's kernels carry no launch
    bounds, so ptxas may take up to 255 registers a thread, and a block of nine warps gets at
    most 224 (65536 / 288, in steps of 8)."""
    monkeypatch.setenv(nvrtc.CACHE_ENV, str(tmp_path))
    layouts = ((False, False), (True, False), (False, True))  # (has_c, nd)
    for cfg, dt, (has_c, nd) in itertools.product(
        (hopper.PREFILL_TMA, hopper.MIDDLE_TMA), HALF_TYPES, layouts
    ):
        sp = hopper.cfg_spec(cfg, has_c, nd)
        t = hopper.template(dt, cfg, has_c, 1.0, 1.0)
        ins = [(dt, 3 if nd else 2)] + [(dt, 2)] * (len(sp.inputs) - 1)
        built = _compile(sp, t, ins, hopper.out_dtypes(cfg, dt))
        _assert_clean(built, f"gemm {cfg} {dt} c={has_c} nd={nd}")
        assert cfg.threads == 288 and built.registers <= 224, (cfg, built.registers)


@has_nvrtc
@pytest.mark.parametrize("dtype, code", [(mx.bfloat16, 10), (mx.float16, 6)])
def test_the_tma_maps_carry_the_ptx_element_code_of_the_launch_dtype(dtype, code):
    """The maps the TMA kernel writes name its operands' element type in tensormap.replace's
    own encoding (PTX ISA: .f16 6, .f64 9, .bf16 10), not the driver's CUtensorMapDataType
    (bf16 9, which tensormap.replace reads as f64: 8-byte elements); both maps of a launch,
    A's and B's, with the 128-byte swizzle (3) and rank 2 (written as 1)."""
    sp = hopper.cfg_spec(hopper.PREFILL_TMA, False, False)
    t = hopper.template(dtype, hopper.PREFILL_TMA, False, 1.0, 0.0)
    outs = list(hopper.out_dtypes(hopper.PREFILL_TMA, dtype))
    source = mlx_jit.render(sp, sp.header(), [(dtype, 2)] * 2, outs, t)
    ptx = nvrtc.compile_ptx(source, sp.name, headers=mlx_jit.STAND_IN_HEADERS)
    fields = {
        f: re.findall(
            rf"tensormap\.replace\.tile\.{f}\.shared::cta\.b1024\.b32 \[%r\d+\], (\d+);", ptx
        )
        for f in ("elemtype", "swizzle_mode", "rank")
    }
    assert fields == {"elemtype": [str(code)] * 2, "swizzle_mode": ["3"] * 2, "rank": ["1"] * 2}


@has_nvrtc
def test_the_precompiled_path_takes_the_tma_configuration_without_tma(monkeypatch):
    """The precompiled entry (where MLX's kernel cache cannot be written) has no TMA copies, so
    a TMA configuration runs there as PREFILL_DEEP_STAGED: the same bits."""
    monkeypatch.setenv(hopper.ENV, "precompiled")
    a, b = mx.zeros((4096, 512), mx.bfloat16), mx.zeros((1024, 512), mx.bfloat16)
    plan = hopper._plan(a, b, False, None, 1.0, 1.0, hopper.PREFILL_TMA)
    assert plan.launch is None and plan.cfg == hopper.PREFILL_DEEP_STAGED


def test_two_per_sm_blocks_fit_two_to_a_multiprocessor_in_shared_memory():
    """TWO_PER_SM exists to share a multiprocessor with a second block: both blocks' shared
    memory and the system's reserve must fit, and the dispatcher must not pick it."""
    for cfg in (hopper.TWO_PER_SM, hopper.TWO_PER_SM_DEEP):
        assert 2 * (cfg.shared_memory + hopper.BLOCK_RESERVED) <= hopper.SM_SHARED, cfg
        assert cfg in hopper.variants() and cfg not in hopper.configs(), cfg
    assert 2 * (hopper.PREFILL.shared_memory + hopper.BLOCK_RESERVED) > hopper.SM_SHARED


@has_nvrtc
def test_two_per_sm_blocks_fit_two_to_a_multiprocessor_in_registers(tmp_path, monkeypatch):
    """Two blocks of 256 threads share a multiprocessor's 65536 registers only at 128 or fewer
    a thread, which ptxas must reach without spilling (else the blocks run one at a time)."""
    monkeypatch.setenv(nvrtc.CACHE_ENV, str(tmp_path))
    for cfg in (hopper.TWO_PER_SM, hopper.TWO_PER_SM_DEEP):
        assert cfg.threads == 256
        for has_c in (False, True):
            sp = hopper.cfg_spec(cfg, has_c)
            t = hopper.template(mx.bfloat16, cfg, has_c, 1.0, 1.0)
            built = _compile(sp, t, [(mx.bfloat16, 2)] * len(sp.inputs), mx.bfloat16)
            _assert_clean(built, f"gemm {cfg} c={has_c}")
            assert built.registers <= 128, f"{cfg} c={has_c}: {built.registers} registers"


@has_nvrtc
def test_representative_kernels_compile_clean(tmp_path, monkeypatch):
    monkeypatch.setenv(nvrtc.CACHE_ENV, str(tmp_path))
    for cfg in (hopper.configs()[0], hopper.choose_config(4096, 4096, 4096)):
        for has_c in (False, True):
            sp = hopper.cfg_spec(cfg, has_c)
            t = hopper.template(mx.bfloat16, cfg, has_c, 1.0, 1.0)
            built = _compile(sp, t, [(mx.bfloat16, 2)] * len(sp.inputs), mx.bfloat16)
            _assert_clean(built, f"gemm {cfg} c={has_c}")
    for cfg in (hopper_qmm.choose_config(1, 4096, 4096, 4), hopper_qmm.decode_config(1, 4096, 4)):
        sp = hopper_qmm.cfg_spec(cfg)
        ins = [(mx.bfloat16, 2), (mx.uint32, 2), (mx.bfloat16, 2), (mx.bfloat16, 2)]
        t = hopper_qmm.template(mx.bfloat16, cfg)
        _assert_clean(_compile(sp, t, ins, mx.bfloat16), f"qmm {cfg}")


@has_nvrtc
def test_rank_free_kernels_compile_clean_and_render_alike_for_every_rank(tmp_path, monkeypatch):
    """The launches that take a (..., K) activation as it is: MLX passes shapes by value, so the
    source it renders (and the module it looks up) is the same for a 2-, 3- or 4-D input."""
    monkeypatch.setenv(nvrtc.CACHE_ENV, str(tmp_path))
    for m in (1, 17):  # the few-row kernel, then wgmma
        cfg = hopper.choose_config(m, 4096, 4096)
        sp = hopper.cfg_spec(cfg, False, True)
        t = hopper.template(mx.bfloat16, cfg, False, 1.0, 0.0)
        texts = {mlx_jit.render(sp, "", [(mx.bfloat16, r), (mx.bfloat16, 2)], [mx.bfloat16], t)
                 for r in (2, 3, 4)}  # fmt: skip
        assert len(texts) == 1 and "a_ndim" in texts.pop()
        ins = [(mx.bfloat16, 3), (mx.bfloat16, 2)]
        _assert_clean(_compile(sp, t, ins, mx.bfloat16), f"gemm nd {cfg}")
    for m in (1, 17):  # the few-row kernel, then wgmma
        q = hopper_qmm.choose_config(m, 4096, 4096, 4)
        qs = hopper_qmm.spec(q.shared_memory, True, q.narrow)
        ins = [(mx.bfloat16, 3), (mx.uint32, 2), (mx.bfloat16, 2), (mx.bfloat16, 2)]
        t = hopper_qmm.template(mx.bfloat16, q)
        _assert_clean(_compile(qs, t, ins, mx.bfloat16), f"qmm nd {q}")
    assert sp.row_contiguous and qs.row_contiguous and not hopper.spec(False, 0).row_contiguous


@has_nvrtc
@pytest.mark.slow
def test_every_kernel_the_dispatcher_can_pick_compiles_clean(tmp_path, monkeypatch):
    monkeypatch.setenv(nvrtc.CACHE_ENV, str(tmp_path))
    for dt in (mx.bfloat16, mx.float16):
        for cfg in hopper.variants():
            for has_c in (False, True):
                sp = hopper.cfg_spec(cfg, has_c)
                t = hopper.template(dt, cfg, has_c, 1.0, 1.0)
                ins, outs = [(dt, 2)] * len(sp.inputs), hopper.out_dtypes(cfg, dt)
                _assert_clean(_compile(sp, t, ins, outs), f"{cfg} {has_c}")
        for b in hopper_qmm.BITS:
            for cfg in hopper_qmm.variants(b):
                sp = hopper_qmm.cfg_spec(cfg)
                ins = [(dt, 2), (mx.uint32, 2), (dt, 2), (dt, 2)]
                _assert_clean(_compile(sp, hopper_qmm.template(dt, cfg), ins, dt), str(cfg))


def test_a_few_row_block_of_an_odd_number_of_warps_is_refused():
    """The stage loader needs a multiple of 64 threads (its swizzle assumes a thread's rows
    are 8 apart); a one-warp block would read its tiles back permuted."""
    for warps in (1, 3):
        with pytest.raises(ValueError, match="even number of warps"):
            hopper.NarrowConfig(1, warps, 12)
    assert all(c.warps % 2 == 0 for c in hopper.variants() if c.narrow)


@has_nvrtc
def test_the_kernel_refuses_to_compile_a_one_warp_few_row_block(tmp_path, monkeypatch):
    """The same limit in the kernel source: the loader's static_assert stops a one-warp
    instantiation at compile time (a two-warp one compiles: the control)."""
    monkeypatch.setenv(nvrtc.CACHE_ENV, str(tmp_path))
    one = object.__new__(hopper.NarrowConfig)  # past the Python-side check
    for name, value in (("nt", 1), ("warps", 1), ("stages", 12)):
        object.__setattr__(one, name, value)
    two = hopper.NarrowConfig(1, 2, 12)
    sp = hopper.spec(False, two.shared_memory, False, True)
    ins = [(mx.bfloat16, 2)] * len(sp.inputs)
    _assert_clean(
        _compile(sp, hopper.template(mx.bfloat16, two, False, 1.0, 0.0), ins, mx.bfloat16),
        "two warps",
    )
    with pytest.raises(nvrtc.CompileError, match="multiple of 64 threads"):
        _compile(sp, hopper.template(mx.bfloat16, one, False, 1.0, 0.0), ins, mx.bfloat16)


@has_nvrtc
def test_nvrtc_cache_is_keyed_by_source(tmp_path, monkeypatch):
    monkeypatch.setenv(nvrtc.CACHE_ENV, str(tmp_path))
    src = 'extern "C" __global__ void k(float* o) { o[threadIdx.x] = %s; }\n'
    one = nvrtc.compile_cubin(src % "1.0f", "k")
    two = nvrtc.compile_cubin(src % "2.0f", "k")
    assert one.cubin != two.cubin and one.path != two.path
    assert one.path.read_bytes() == one.cubin
    nvrtc._MEMO.clear()
    again = nvrtc.compile_cubin(src % "1.0f", "k")  # from disk now
    assert again.cubin == one.cubin
    one.path.write_bytes(b"not an ELF file")  # a damaged entry is compiled again, not used
    nvrtc._MEMO.clear()
    assert nvrtc.compile_cubin(src % "1.0f", "k").cubin == one.cubin


# ---- on a Hopper GPU --------------------------------------------------------------------------


@on_hopper
def test_mlx_renders_the_source_bi_rl_installed():
    import tools_path  # noqa: F401 - puts tools/ on sys.path
    from hopper_check import Results, render_check

    res = Results()
    render_check(res)
    assert res.failed == 0


def _tma_maps(x, w, cfg) -> np.ndarray:
    """The scratch output of a TMA configuration's kernel for x @ w.T, launched as its plan
    launches it but zeroed first: tensor maps where its blocks copied by TMA, zeros where they
    ran gemm.cu's loop (operands TMA cannot read)."""
    hopper.gemm(x, w, b_kn=False, config=cfg)  # builds the plan
    sig = (x.dtype, x.shape, w.dtype, w.shape, False, 1.0, 1.0, cfg)
    _, maps = hopper._PLANS.get(sig).launch(x, w, init_value=0, with_scratch=True)
    return np.array(maps)


@on_hopper
@pytest.mark.parametrize("dtype", [mx.bfloat16, mx.float16], ids=str)
@pytest.mark.parametrize(
    ("tma", "base"),
    [(hopper.PREFILL_TMA, hopper.PREFILL_DEEP_STAGED), (hopper.MIDDLE_TMA, hopper.MIDDLE)],
    ids=["128x256", "128x128"],
)
def test_tma_copies_give_the_cp_async_bits_and_fall_back_where_they_cannot_read(dtype, tma, base):
    """PREFILL_TMA and MIDDLE_TMA (gemm_tma.cu) against PREFILL_DEEP_STAGED and MIDDLE (gemm.cu),
    the same blocks fed by cp.async, bit for bit, output poisoned with NaN: row, column and k
    tails (1, 129, 4097 rows; K 2040; 264 and 2056 columns) and a 300 x 64 x 40 product copied
    by TMA (guard: its blocks wrote tensor maps);
    K 2044 (rows not 16-byte multiples apart) and A's columns 4.. of a wider array (a start
    8 bytes past an alignment) through the kernel's fallback (guard: no map written); A's rows
    reversed (a view whose rows may be a negative distance apart, which a map cannot describe:
    bits only, since whether the view reaches the kernel uncopied is MLX's choice); B read
    transposed (b_kn) and an addmm's c."""
    nan = float("nan")

    def both(x, w, **kw):
        ref = hopper.gemm(x, w, config=base, poison=nan, **kw)
        got = hopper.gemm(x, w, config=tma, poison=nan, **kw)
        assert not np.isnan(f64(ref)).any()
        assert (bits(got) == bits(ref)).all(), f"{x.shape} x {w.shape} {kw}: TMA differs"

    for m, k, n in ((1, 2048, 256), (129, 2040, 264), (4097, 2048, 2056), (300, 64, 40)):
        x, w = rand((m, k), dtype, 1), rand((n, k), dtype, 2, scale=k**-0.5)
        both(x, w, b_kn=False)
        assert _tma_maps(x, w, tma).any(), f"{m} x {k} x {n}: no tensor map written"
    wide = rand((300, 2060), dtype, 3)
    for x in (rand((300, 2044), dtype, 4), wide[:, 4:2052]):
        w = rand((512, x.shape[1]), dtype, 5, scale=0.02)
        both(x, w, b_kn=False)
        assert not _tma_maps(x, w, tma).any(), f"{x.shape}: maps written where TMA cannot read"
    both(wide[::-1, :2048], rand((512, 2048), dtype, 10, scale=0.02), b_kn=False)
    x, w = rand((700, 2048), dtype, 6), rand((2048, 1024), dtype, 7, scale=0.02)
    both(x, w, b_kn=True)  # B's k-stride is N: the fallback
    c = rand((1024,), dtype, 8)
    both(x, rand((1024, 2048), dtype, 9, scale=0.02), b_kn=False, c=c, alpha=0.5, beta=2.0)


@on_hopper
@pytest.mark.parametrize("dtype", [mx.bfloat16, mx.float16], ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_every_configuration_and_batch_gives_the_same_bits(dtype, shape):
    k, n = shape
    w = rand((n, k), dtype, 1, scale=k**-0.5)
    x = rand((300, k), dtype, 2)
    outs = {
        cfg: bits(hopper.gemm(x, w, b_kn=False, config=cfg, poison=float("nan")))
        for cfg in hopper.variants()
    }
    base = outs[hopper.variants()[0]]
    for cfg, got in outs.items():
        assert (got == base).all(), f"{cfg} differs from {hopper.variants()[0]}"
    assert not np.isnan(f64(hopper.gemm(x, w, b_kn=False, poison=float("nan")))).any()
    for m in MS:
        for off in (0, 5):
            got = bits(hopper.gemm(x[off : off + m], w, b_kn=False))
            assert (got == base[off : off + m]).all(), f"rows {off}..{off + m} alone differ"
    ref = f64(x) @ f64(w).T
    err = relerr(hopper.gemm(x, w, b_kn=False), ref)
    stock = relerr(x @ w.T, ref)
    assert err <= 1.2 * stock + 1e-4, f"error {err:.2e} against stock's {stock:.2e}"


@on_hopper
@pytest.mark.parametrize("dtype", [mx.bfloat16, mx.float16], ids=str)
def test_activations_of_any_rank_give_the_bits_of_their_rows(dtype):
    """A (B, T, K) activation goes to the kernel as it is (no reshape): the same bits as its
    rows as a 2-D (M, K) operand, for every configuration, also for a non-contiguous view
    (MLX copies it to row-contiguous first), and the launch really is the rank-free one."""
    k, n = 264, 72  # tails in K and N
    w = rand((n, k), dtype, 1, scale=k**-0.5)
    big = rand((4, 66, k), dtype, 2)
    views = [
        big[:1, :1],
        big[:2, :1],
        big[:3, :5],
        big[:1, :65],
        big[:, ::2],
        big[:2].swapaxes(0, 1),
    ]
    for x3 in views:
        flat = mx.array(np.array(x3.astype(mx.float32))).astype(dtype).reshape(-1, k)  # a copy
        for cfg in hopper.configs():
            got = hopper.gemm(x3, w, b_kn=False, config=cfg, poison=float("nan"))
            want = hopper.gemm(flat, w, b_kn=False, config=cfg).reshape(*x3.shape[:-1], n)
            assert tuple(got.shape) == tuple(want.shape)
            assert (bits(got) == bits(want)).all(), f"{x3.shape} {cfg}: rank-3 rows differ"
    mx.eval(hopper.gemm(big, w, b_kn=False))
    plan = hopper._PLANS[(dtype, big.shape, dtype, w.shape, False, 1.0, 1.0, None)]
    assert plan.cfg == hopper.choose_config(4 * 66, n, k)
    assert plan.launch.spec == hopper.cfg_spec(plan.cfg, False, True)
    assert plan.launch.out_shape == (4, 66, n) and plan.lead is None


@on_hopper
def test_stock_control_differs_where_the_kernel_does_not():
    """The comparison above can fail: stock MLX's rows change with the batch on this shape."""
    k, n = 2048, 2048
    w = rand((n, k), mx.bfloat16, 1, scale=k**-0.5)
    x = rand((300, k), mx.bfloat16, 2)
    full = bits(x @ w.T)
    assert any((bits(x[:m] @ w.T) != full[:m]).any() for m in (1, 7, 8, 9, 64, 65, 129))


@on_hopper
@pytest.mark.parametrize("dtype", [mx.bfloat16, mx.float16], ids=str)
def test_operand_forms_and_epilogues(dtype):
    k, n = 256, 200
    w = rand((n, k), dtype, 3, scale=k**-0.5)
    x = rand((2, 70, k), dtype, 4)
    x2 = x.reshape(140, k)
    lin = bits(hopper.gemm(x, w, b_kn=False).reshape(140, n))
    assert (bits(hopper.gemm(x2, w.T, b_kn=True)) == lin).all(), "a W.T view"
    assert (bits(hopper.gemm(x2, mx.contiguous(w.T), b_kn=True)) == lin).all(), "a (K, N) b"
    flat = rand((140 * k + 1,), dtype, 8)
    mis, al = flat[1:].reshape(140, k), mx.contiguous(flat[1:].reshape(140, k))
    got, want = bits(hopper.gemm(mis, w, b_kn=False)), bits(hopper.gemm(al, w, b_kn=False))
    assert (got == want).all(), "a misaligned view"
    bias = rand((n,), dtype, 5)
    withb = hopper.gemm(x2, w, b_kn=False, c=bias)
    for i in (0, 63, 64, 139):
        assert (bits(hopper.gemm(x2[i : i + 1], w, b_kn=False, c=bias)) == bits(withb)[i]).all()
    ref = f64(x2) @ f64(w).T
    assert relerr(withb, ref + f64(bias)) < 5e-3
    c = rand((2, 70, n), dtype, 6)
    am = hopper.gemm(x, w.T, b_kn=True, c=c, alpha=0.5, beta=2.0).reshape(140, n)
    assert relerr(am, 0.5 * ref + 2.0 * f64(c.reshape(140, n))) < 5e-3


@on_hopper
@pytest.mark.parametrize("dtype", [mx.bfloat16, mx.float16], ids=str)
@pytest.mark.parametrize("shape", [(264, 512), (72, 264), (64, 200), (100, 37)], ids=str)
def test_the_staged_epilogue_has_the_prefill_bits_in_every_form(monkeypatch, dtype, shape):
    """PREFILL_STAGED and PREFILL_DEEP_STAGED against PREFILL bit for bit: plain (output
    poisoned first, so an element left unwritten shows), with a bias row, as addmm with alpha
    and beta on a W.T view, the rank-free entry, the precompiled entry; at 256 rows (whole
    tiles where N allows), 300 (a row tail) and 129. (K, N): whole 256-column tiles, a column
    tail, N % 8 != 0 (every tile through store_tile), an odd N. The plan's kernel is the
    staged one."""
    k, n = shape
    w = rand((n, k), dtype, 1, scale=k**-0.5)
    x = rand((300, k), dtype, 2)
    bias = rand((n,), dtype, 3)
    c = rand((300, n), dtype, 4)

    def forms(cfg, m):
        return [
            hopper.gemm(x[:m], w, b_kn=False, config=cfg, poison=float("nan")),
            hopper.gemm(x[:m], w, b_kn=False, c=bias, config=cfg),
            hopper.gemm(x[:m], w.T, b_kn=True, c=c[:m], alpha=0.5, beta=2.0, config=cfg),
            hopper.gemm(x[None, :m], w, b_kn=False, config=cfg),  # the rank-free entry
        ]

    for m in (256, 300, 129):
        want = [bits(o) for o in forms(hopper.PREFILL, m)]
        for cfg in (hopper.PREFILL_STAGED, hopper.PREFILL_DEEP_STAGED):
            for i, got in enumerate(forms(cfg, m)):
                assert (bits(got) == want[i]).all(), f"{cfg} form {i} at {m} rows differs"
            sig = (dtype, (m, k), dtype, (n, k), False, 1.0, 1.0, cfg)
            assert hopper._PLANS[sig].launch.spec == hopper.cfg_spec(cfg, False)
    monkeypatch.setenv(hopper.ENV, "precompiled")
    hopper._PLANS.clear()
    want = bits(hopper.gemm(x, w, b_kn=False, c=bias, config=hopper.PREFILL))
    for cfg in (hopper.PREFILL_STAGED, hopper.PREFILL_DEEP_STAGED):
        got = bits(hopper.gemm(x, w, b_kn=False, c=bias, config=cfg))
        assert (got == want).all(), f"{cfg}: the precompiled entry differs"
    hopper._PLANS.clear()


@on_hopper
@pytest.mark.parametrize("dtype", [mx.bfloat16, mx.float16], ids=str)
@pytest.mark.parametrize("shape", [(100, 65), (2048, 2048), (4096, 264)], ids=str)
def test_the_few_row_kernel_has_the_wgmma_bits_in_every_form(monkeypatch, dtype, shape):
    """Every few-row configuration against the wgmma kernel: plain, with a bias row, as addmm
    with alpha and beta, on a W.T view and a misaligned activation (the element loader), tails
    in K and an odd N; and through the dispatcher at 1, 7, 8, 9, 15, 16 rows (the few-row
    kernel, checked to have run) and 17 (wgmma)."""
    k, n = shape
    w = rand((n, k), dtype, 1, scale=k**-0.5)
    x = rand((17, k), dtype, 2)
    bias = rand((n,), dtype, 3)
    c = rand((17, n), dtype, 4)
    flat = rand((17 * k + 1,), dtype, 5)
    mis = flat[1:].reshape(17, k)
    wg = hopper.configs()[0]

    def forms(cfg):
        return [
            hopper.gemm(x, w, b_kn=False, config=cfg, poison=float("nan")),
            hopper.gemm(x, w, b_kn=False, c=bias, config=cfg),
            hopper.gemm(x, w.T, b_kn=True, c=c, alpha=0.5, beta=2.0, config=cfg),
            hopper.gemm(mis, w, b_kn=False, config=cfg),
            hopper.gemm(x[None, :5], w, b_kn=False, config=cfg),  # the rank-free entry
        ]

    want = [bits(o) for o in forms(wg)]
    for cfg in (*hopper.NARROW, hopper.NARROW_UNPICKED):
        for i, got in enumerate(forms(cfg)):
            assert (bits(got) == want[i]).all(), f"{cfg} form {i} differs from {wg}"
    monkeypatch.delenv(hopper.NARROW_ENV, raising=False)
    hopper._PLANS.clear()  # plans are built once per signature: none from before the switch
    ran = []
    real = hopper._plan
    monkeypatch.setattr(hopper, "_plan", lambda *a: ran.append(real(*a)) or ran[-1])
    for m in (1, 7, 8, 9, 15, 16, 17):
        got = bits(hopper.gemm(x[:m] + 0, w, b_kn=False, c=bias))
        assert ran[-1].cfg.narrow == (m <= 16), f"{m} rows took {ran[-1].cfg}"
        assert (got == want[1][:m]).all(), f"{m} rows through the dispatcher differ"


@on_hopper
@pytest.mark.parametrize("nbits", hopper_qmm.BITS)
@pytest.mark.parametrize("group", [32, 64, 128])
def test_quantized_every_configuration_and_batch_gives_the_same_bits(nbits, group):
    for k, n in ((256, 72), (160 if group == 32 else 384, 40)):
        if k % group:
            continue
        wq, sc, bi = mx.quantize(rand((n, k), mx.bfloat16, 11, k**-0.5), group, nbits)
        x = rand((300, k), mx.bfloat16, 12)
        outs = [
            bits(hopper_qmm.quantized_matmul(x, wq, sc, bi, group, nbits, config=cfg))
            for cfg in hopper_qmm.variants(nbits)
        ]
        assert all((o == outs[0]).all() for o in outs), f"configurations differ, K={k} N={n}"
        for m in MS:
            got = bits(hopper_qmm.quantized_matmul(x[:m], wq, sc, bi, group, nbits))
            assert (got == outs[0][:m]).all(), f"M={m} K={k} N={n}"
        wd = mx.dequantize(wq, sc, bi, group_size=group, bits=nbits)
        ref = f64(x) @ f64(wd).T
        err = relerr(hopper_qmm.quantized_matmul(x, wq, sc, bi, group, nbits), ref)
        stock = relerr(mx.quantized_matmul(x, wq, sc, bi, True, group, nbits), ref)
        assert err <= 1.2 * stock + 1e-3, f"error {err:.2e} against stock's {stock:.2e}"


# -- what a dequantised weight is ----------------------------------------------------------


def _round_once(v: np.ndarray, significant: int) -> np.ndarray:
    """float64 values (normal, nonzero) rounded once, to nearest even, to `significant`
    significant bits (8: bf16, 11: f16); exact as float64."""
    m, e = np.frexp(v)  # v = m 2^e, 0.5 <= |m| < 1
    return np.ldexp(np.rint(np.ldexp(m, significant)), e - significant)


def _half_bits(v: np.ndarray, dtype) -> np.ndarray:
    """Bits of float64 values that the half type holds exactly."""
    if dtype == mx.bfloat16:
        return (v.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
    return v.astype(np.float16).view(np.uint16)


def _pack(q: np.ndarray, bits: int) -> np.ndarray:
    """q (N, K) of `bits`-bit values packed as mx.quantize packs them: row n a little-endian
    stream of bits in uint32 words."""
    n, k = q.shape
    stream = ((q[:, :, None] >> np.arange(bits)) & 1).astype(np.uint8).reshape(n, k * bits)
    return np.packbits(stream, axis=1, bitorder="little").view(np.uint32)


def _affine(n: int, k: int, bits: int, dtype, seed: int):
    """A `bits`-bit, group-64 weight made from chosen q, s and b, and w = s q + b exactly, as
    float64. Row 0's first group is s = 135/128, b = 2^-30 with q = 3 at k = 0: s q = 405/128
    is halfway between two bf16 values (8 significant bits) and b is below half a float32
    ulp of it, so s q + b rounded once is 406/128, while the float32 fma rounded again to
    bf16 gives 404/128 (the tie goes to the even one)."""
    rng = np.random.default_rng(seed)
    q = rng.integers(0, 1 << bits, size=(n, k)).astype(np.uint32)
    s = _round_once(rng.uniform(0.5, 2.0, size=(n, k // 64)), 8)
    b = _round_once(rng.uniform(-1.0, 1.0, size=(n, k // 64)), 8)
    s[0, 0], b[0, 0], q[0, 0] = 135 / 128, 2.0**-30, 3
    sc, bi = (mx.array(a.astype(np.float32)).astype(dtype) for a in (s, b))
    # w from the scales and biases as the half type holds them (f16 flushes b = 2^-30 to 0)
    s, b = (np.array(a.astype(mx.float32)).astype(np.float64) for a in (sc, bi))
    w = np.repeat(s, 64, axis=1) * q + np.repeat(b, 64, axis=1)
    return (mx.array(_pack(q, bits)), sc, bi), w, q


@pytest.mark.parametrize("bits", hopper_qmm.BITS)
def test_the_dequantisation_test_packs_its_weights_as_mlx_does(bits):
    """The test below builds its packed weights itself: MLX's own dequantize, with scale 1
    and bias 0, reads back exactly the q they were made from."""
    (wq, _, _), _, q = _affine(8, 128, bits, mx.float32, 1)
    ones, zeros = mx.ones((8, 2), mx.float32), mx.zeros((8, 2), mx.float32)
    got = np.array(mx.dequantize(wq, ones, zeros, group_size=64, bits=bits))
    assert (got == q).all()


def test_the_tie_in_the_dequantisation_test_tells_one_rounding_from_two():
    """The control of the test below: at row 0, k = 0 its weight's bits under one rounding
    and under a float32 fma rounded again to bf16 differ (so the test can tell them apart),
    and nowhere else does the construction leave float64 inexact."""
    _, w, _ = _affine(16, 128, 4, mx.bfloat16, 0)
    once = _half_bits(_round_once(w, 8), mx.bfloat16)
    twice = _half_bits(_round_once(w.astype(np.float32).astype(np.float64), 8), mx.bfloat16)
    assert w[0, 0] == 405 / 128 + 2.0**-30
    assert once[0, 0] != twice[0, 0] and once[0, 0] == _half_bits(np.array(406 / 128), mx.bfloat16)


@on_hopper
@pytest.mark.parametrize("bits", hopper_qmm.BITS)
@pytest.mark.parametrize("dtype", [mx.bfloat16, mx.float16], ids=str)
def test_a_dequantised_weight_is_s_q_plus_b_rounded_once(dtype, bits):
    """Every weight the quantized kernels multiply is s q + b rounded once to the half type,
    at every bit width, in every configuration (few-row and wgmma) and through the
    dispatcher: x of one-hot rows, 16 at a time, so out[m, n] = w[n, k_m] exactly; bit for
    bit against float64 rounded once, in bf16 the tie at row 0, k = 0 included (the test
    above shows it would read 404/128 under two roundings; f16 holds 405/128 exactly)."""
    n, k = 16, 128
    (wq, sc, bi), w, _ = _affine(n, k, bits, dtype, 0)
    want = _half_bits(_round_once(w, 8 if dtype == mx.bfloat16 else 11), dtype).T  # (k, n)
    eye = mx.eye(k, dtype=dtype)
    got = np.array(hopper_qmm.quantized_matmul(eye, wq, sc, bi, 64, bits).view(mx.uint16))
    assert (got == want).all(), "the dispatcher's pick at 128 rows"
    for cfg in hopper_qmm.variants(bits):
        for m0 in range(0, k, 16):
            out = hopper_qmm.quantized_matmul(eye[m0 : m0 + 16], wq, sc, bi, 64, bits, config=cfg)
            assert (np.array(out.view(mx.uint16)) == want[m0 : m0 + 16]).all(), f"{cfg} {m0}"


@on_hopper
@pytest.mark.parametrize("n", [100, 128])
@pytest.mark.parametrize("nbits", hopper_qmm.BITS)
@pytest.mark.parametrize(
    ("group", "dtype"), [(32, mx.bfloat16), (128, mx.bfloat16), (64, mx.float16)], ids=str
)
def test_the_few_row_quantized_kernel_has_the_wgmma_bits_in_every_form(
    monkeypatch, nbits, group, dtype, n
):
    """Every few-row quantized configuration against the wgmma one: 2-D, 3-D (the rank-free
    entry) and a misaligned activation (the element loader), K with a 32-wide tail past its
    last 64-wide k-tile (group 32) or a whole one; N no block width divides (100: the last
    block takes the checked copy; K of 3-4 k-tiles) or every one does (128: every block takes
    the unchecked copy of its whole k-tiles, the last row's scale and bias words clipped at
    the arrays' end; K of 14-16 k-tiles, past every configuration's stage count, so the
    stages wrap; the warp-specialised ones too, whose own test wraps theirs); then through the
    dispatcher at 1, 7, 8, 9, 15 and 16 rows (the warp-specialised few-row kernel, checked to
    have run) and 17 (wgmma, the control that the switch is where it is said to be)."""
    k = (160 if group == 32 else 256) if n == 100 else (992 if group == 32 else 896)
    wq, sc, bi = mx.quantize(rand((n, k), dtype, 13, k**-0.5), group, nbits)
    x = rand((17, k), dtype, 14)
    flat = rand((17 * k + 1,), dtype, 15)
    mis = flat[1:].reshape(17, k)
    wg = hopper_qmm.decode_config(16, n, nbits)

    def forms(cfg):
        def q(a):
            return hopper_qmm.quantized_matmul(a, wq, sc, bi, group, nbits, config=cfg)

        return [q(x), q(x[None, :5]), q(mis)]

    want = [bits(o) for o in forms(wg)]
    unpicked = hopper_qmm.QNarrowConfig(*hopper_qmm.NARROW_UNPICKED, bits=nbits)
    for cfg in (*hopper_qmm.narrow_configs(nbits), unpicked, *hopper_qmm.ws_configs(nbits)):
        for i, got in enumerate(forms(cfg)):
            assert (bits(got) == want[i]).all(), f"{cfg} form {i} differs from {wg}"
    monkeypatch.delenv(hopper.NARROW_ENV, raising=False)
    hopper_qmm._PLANS.clear()  # plans are built once per signature: none from before
    names = []
    real = hopper_qmm.kernel
    monkeypatch.setattr(hopper_qmm, "kernel", lambda sp: names.append(sp.name) or real(sp))
    for m in (1, 7, 8, 9, 15, 16, 17):
        got = bits(hopper_qmm.quantized_matmul(x[:m] + 0, wq, sc, bi, group, nbits))
        assert names[-1] == ("bi_hopper_qmm_ws" if m <= 16 else "bi_hopper_qmm"), (m, names)
        assert (got == want[0][:m]).all(), f"{m} rows through the dispatcher differ"
    hopper_qmm._PLANS.clear()


@on_hopper
@pytest.mark.parametrize("nbits", [3, 4, 8])
@pytest.mark.parametrize(("group", "k"), [(32, 35 * 64 + 32), (64, 35 * 64), (128, 36 * 64)])
@pytest.mark.parametrize("n", [100, 128])
def test_the_warp_specialised_few_row_kernel_wraps_its_rings(nbits, group, k, n):
    """The warp-specialised few-row configurations against the wgmma one where every helper's
    stages and slots wrap several times: 35-36 k-tiles (four helpers of four stages and one
    slot each), with K's tail past its last whole k-tile (group 32) or not; N no block width
    divides (100: the last block's checked copy) or every one does (128); 1, 8 and 16 rows."""
    wq, sc, bi = mx.quantize(rand((n, k), mx.bfloat16, 16, k**-0.5), group, nbits)
    x = rand((16, k), mx.bfloat16, 17)
    wg = hopper_qmm.decode_config(16, n, nbits)
    for m in (1, 8, 16):
        want = bits(hopper_qmm.quantized_matmul(x[:m], wq, sc, bi, group, nbits, config=wg))
        for cfg in hopper_qmm.ws_configs(nbits):
            assert 2 * cfg.stages <= k // 64, cfg  # each helper's stages wrap at least once
            got = bits(hopper_qmm.quantized_matmul(x[:m], wq, sc, bi, group, nbits, config=cfg))
            assert (got == want).all(), f"{cfg} differs from {wg} at {m} rows, K={k} N={n}"


@on_hopper
@pytest.mark.parametrize("dtype", [mx.bfloat16, mx.float16], ids=str)
@pytest.mark.parametrize(
    "widths", [(2048, 1024, 1024), (512, 512), (128, 256, 384), (96, 48), (72, 40)], ids=str
)
def test_one_launch_over_sibling_weights_has_each_weights_own_bits(monkeypatch, dtype, widths):
    """The grouped few-row entry (one launch over 2-3 weights read with one activation) gives
    every output the bits of that weight's own linear, at 1, 7, 8, 9 and 16 rows, 2-D and 3-D,
    with K's tail past a 64-wide k-tile, in every few-row configuration whose columns divide
    the widths (at 96, 48 only the 16-column blocks); guards: the grouped launch ran, except
    where no configuration's columns divide the widths (72, 40), and at 17 rows it does not
    apply."""
    k = 200
    ws = [rand((n, k), dtype, 10 + i, scale=k**-0.5) for i, n in enumerate(widths)]
    x = rand((17, k), dtype, 20)
    calls = []
    real = hopper.kernel
    monkeypatch.setattr(hopper, "kernel", lambda sp: calls.append(sp.name) or real(sp))
    configs = [hopper.group_config(widths)] if hopper.group_config(widths) else []
    for m in (1, 7, 8, 9, 16):
        for xm in (x[:m], x[None, :m]):
            want = [bits(cuda_gemm.linear(xm, w)) for w in ws]
            hopper._GROUPS.clear()
            calls.clear()
            got = cuda_gemm.grouped_linear(xm, ws)
            for g, (o, w_) in enumerate(zip(got, want, strict=True)):
                assert (bits(o) == w_).all(), f"{m} rows {xm.ndim}-D: weight {g} differs"
            grouped = any(name.endswith(f"_g{len(ws)}") for name in calls)
            assert grouped == bool(configs), f"{m} rows: grouped launch ran: {grouped}"
    for cfg in hopper.NARROW:  # each configuration that divides the widths, forced
        if any(n % cfg.bn for n in widths):
            continue
        monkeypatch.setattr(hopper, "group_config", lambda w, cfg=cfg: cfg)
        hopper._GROUPS.clear()
        got = cuda_gemm.grouped_linear(x[:9], ws)
        for o, w in zip(got, ws, strict=True):
            assert (bits(o) == bits(cuda_gemm.linear(x[:9], w))).all(), f"{cfg} differs"
    monkeypatch.undo()
    hopper._GROUPS.clear()
    assert hopper.grouped_linear(x, ws) is None, "17 rows: past the few-row kernel"


def _quantized_members(widths, k, group, nbits, dtype=mx.bfloat16):
    return [
        mx.quantize(rand((n, k), dtype, 40 + i, k**-0.5), group, nbits)
        for i, n in enumerate(widths)
    ]


@on_hopper
@pytest.mark.parametrize(
    ("nbits", "group", "dtype"),
    [(b, g, mx.bfloat16) for b in hopper_qmm.BITS for g in (32, 64, 128)] + [(4, 64, mx.float16)],
    ids=str,
)
def test_one_quantized_launch_over_sibling_weights_has_each_weights_own_bits(
    monkeypatch, nbits, group, dtype
):
    """The grouped quantized entry (one launch over 2-3 packed weights read with one
    activation) gives every output the bits of that weight's own quantized_matmul, at 1, 7, 8,
    9, 16, 17, 33 and 64 rows (each row tile's edges), 2-D and 3-D, widths that are and are not
    multiples of the block's columns, in every configuration the grouped dispatcher can pick
    (forced one by one); guards: the grouped launch ran, and at 65 rows it does not apply
    (the members then run one by one, with the same bits)."""
    from bi_rl.backends.cuda import qmm as cuda_qmm

    k = 256
    calls = []
    pick = hopper_qmm.group_config
    real = hopper_qmm.kernel
    monkeypatch.setattr(hopper_qmm, "kernel", lambda sp: calls.append(sp.name) or real(sp))
    x = rand((65, k), dtype, 21)
    for widths in ((72, 40, 24), (96, 48)):
        members = _quantized_members(widths, k, group, nbits, dtype)
        g = len(members)

        def singles(xm, members=members):
            return [
                bits(cuda_qmm.quantized_matmul(xm, w, s, b, True, group, nbits))
                for w, s, b in members
            ]

        for m in (1, 7, 8, 9, 16, 17, 33, 64, 65):
            for xm in (x[:m], x[None, :m]):
                want = singles(xm)
                hopper_qmm._GROUPS.clear()
                calls.clear()
                got = cuda_qmm.grouped_quantized_matmul(xm, members, group, nbits)
                for i, (o, w_) in enumerate(zip(got, want, strict=True)):
                    assert (bits(o) == w_).all(), f"{widths} {m} rows {xm.ndim}-D: member {i}"
                grouped = any(name.endswith((f"_g{g}", f"_g{g}_n")) for name in calls)
                assert grouped == (m <= hopper_qmm.GROUP_ROWS), f"{m} rows: grouped: {grouped}"
        want = singles(x[:9])
        for cfg in hopper_qmm.group_configs(nbits):  # each configuration, forced
            monkeypatch.setattr(hopper_qmm, "group_config", lambda m, w, b, cfg=cfg: cfg)
            hopper_qmm._GROUPS.clear()
            calls.clear()
            got = cuda_qmm.grouped_quantized_matmul(x[:9], members, group, nbits)
            ran = f"_g{g}_n" if cfg.narrow else f"_g{g}"
            assert any(name.endswith(ran) for name in calls), f"{cfg}: grouped launch"
            for i, (o, w_) in enumerate(zip(got, want, strict=True)):
                assert (bits(o) == w_).all(), f"{widths} {cfg}: member {i} differs"
        monkeypatch.setattr(hopper_qmm, "group_config", pick)  # the dispatcher's own again
    hopper_qmm._GROUPS.clear()


@has_nvrtc
@pytest.mark.parametrize("g", hopper_qmm.GROUP_SIZES)
def test_grouped_quantized_entry_compiles_clean(tmp_path, monkeypatch, g):
    """The grouped entry in the configurations a 1.7B-shaped decode step takes (4-bit; the
    GPU test compiles every bit width's), no spills, no serialised wgmma."""
    monkeypatch.setenv(nvrtc.CACHE_ENV, str(tmp_path))
    for m in (1, 64):
        cfg = hopper_qmm.group_config(m, (2048, 1024, 1024)[:g], 4)
        assert cfg.narrow == (m == 1)
        sp = hopper_qmm.group_spec(g, cfg.shared_memory, cfg.narrow)
        t = hopper_qmm.template(mx.bfloat16, cfg)
        ins = [(mx.bfloat16, 3)] + [(mx.uint32, 2), (mx.bfloat16, 2), (mx.bfloat16, 2)] * g
        source = mlx_jit.render(sp, sp.header(), ins, [mx.bfloat16] * g, t)
        entry = "mlx::core::cu::" + mlx_jit.kernel_name(sp.name, t)
        built = nvrtc.compile_cubin(
            source, sp.name, "sm_90a", headers=mlx_jit.STAND_IN_HEADERS, names=(entry,)
        )
        _assert_clean(built, f"grouped qmm g{g} {cfg}")


def test_grouped_quantized_matmul_plans_one_launch(monkeypatch):
    """What the grouped quantized entry hands MLX, on any machine: one call with the activation
    and each member's packed weight, scales and biases in order, one output per member in the
    activation's leading shape, a grid of the members' tiles laid end to end, the configuration
    a single product of the summed width would take; and no grouped launch past 64 rows, for
    another K, mixed dtypes, a member without biases, or a group of one or four."""
    rec, names = [], []

    def record(**kw):
        rec.append(kw)
        return [
            mx.zeros(s, d) for s, d in zip(kw["output_shapes"], kw["output_dtypes"], strict=True)
        ]

    monkeypatch.setattr(hopper_qmm, "kernel", lambda sp: names.append(sp.name) or record)
    monkeypatch.setattr(hopper_qmm, "prepare_group", lambda *a: True)
    monkeypatch.setattr(hopper_qmm, "_GROUPS", type(hopper_qmm._GROUPS)())
    members = _quantized_members((2048, 1024, 1024), 64, 32, 4)
    x = mx.zeros((1, 3, 64), mx.bfloat16)
    outs = hopper_qmm.grouped_quantized_matmul(x, members, 32, 4)
    assert [o.shape for o in outs] == [(1, 3, 2048), (1, 3, 1024), (1, 3, 1024)]
    c = rec[-1]
    assert [tuple(i.shape) for i in c["inputs"]] == [(1, 3, 64)] + [
        shape for n in (2048, 1024, 1024) for shape in ((n, 8), (n, 2), (n, 2))
    ]
    arrays = [a for mem in members for a in mem]
    assert all(a is b for a, b in zip(c["inputs"][1:], arrays, strict=True))
    cfg = hopper_qmm.group_config(3, (2048, 1024, 1024), 4)
    # 3 rows: the few-row kernel's 16-column blocks, two-warp ones (no grouped warp-specialised
    # entry)
    assert cfg == hopper_qmm.narrow_configs(4)[0] and hopper_qmm.pick_narrow(4096, 4).helpers
    blocks = sum(cfg.blocks(3, n) for n in (2048, 1024, 1024))
    assert c["grid"] == (blocks * cfg.threads, 1, 1) and c["threadgroup"] == (cfg.threads, 1, 1)
    assert c["template"] == hopper_qmm.template(mx.bfloat16, cfg)
    assert names[-1] == "bi_hopper_qmm_g3_n"
    wide = hopper_qmm.group_config(1, (6144, 6144), 4)  # gate/up: the pick for 12288 columns
    assert wide == hopper_qmm.pick_narrow(12288, 4) and wide.bn == 64
    x17 = mx.zeros((17, 64), mx.bfloat16)  # past the few-row kernel: wgmma's decode blocks
    hopper_qmm.grouped_quantized_matmul(x17, members, 32, 4)
    assert names[-1] == "bi_hopper_qmm_g3"
    assert rec[-1]["template"] == hopper_qmm.template(
        mx.bfloat16, hopper_qmm.decode_config(17, 4096, 4)
    )
    n = len(rec)
    w, s, b = members[0]
    for args in (
        (mx.zeros((65, 64), mx.bfloat16), members),  # past the decode configurations
        (x, [members[0], _quantized_members((1024,), 128, 32, 4)[0]]),  # another K
        (
            x,
            [
                members[0],
                tuple(a.astype(mx.float16) if a.dtype != mx.uint32 else a for a in members[1]),
            ],
        ),  # mixed dtypes
        (x, [members[0], (w, s, None)]),  # no biases
        (x, members[:1]),  # a group of one
        (x, [*members, members[0]]),  # of four
    ):
        assert hopper_qmm.grouped_quantized_matmul(args[0], args[1], 32, 4) is None
    assert len(rec) == n, "none of those launched"


def test_the_backend_checks_a_groups_members_once_per_signature(monkeypatch):
    """The CUDA backend's grouped_quantized_matmul, on any machine: the first call checks each
    member as its own quantized_matmul would (its plan built, its errors raised) and launches
    the group; later calls with the same signature launch at once; a member whose shapes do
    not agree raises quantized_matmul's error and nothing is remembered for it."""
    from bi_rl.backends.cuda import qmm as cuda_qmm

    launches = []

    def record(**kw):
        launches.append(kw)
        return [
            mx.zeros(s, d) for s, d in zip(kw["output_shapes"], kw["output_dtypes"], strict=True)
        ]

    monkeypatch.setattr(hopper, "available", lambda: True)
    monkeypatch.setattr(hopper_qmm, "kernel", lambda sp: record)
    monkeypatch.setattr(hopper_qmm, "prepare", lambda *a: True)
    monkeypatch.setattr(hopper_qmm, "prepare_group", lambda *a: True)
    # fresh plan tables, so that no plan with the stand-in outlives the test
    for mod, name in ((cuda_qmm, "_PLANS"), (cuda_qmm, "_CHECKED"), (hopper_qmm, "_PLANS")):
        monkeypatch.setattr(mod, name, type(getattr(mod, name))())
    monkeypatch.setattr(hopper_qmm, "_GROUPS", type(hopper_qmm._GROUPS)())
    checked = []
    real = cuda_qmm._plan
    monkeypatch.setattr(cuda_qmm, "_plan", lambda *a: checked.append(1) or real(*a))
    members = _quantized_members((256, 128, 128), 64, 32, 4)
    x = mx.zeros((1, 1, 64), mx.bfloat16)
    for _ in range(3):
        outs = cuda_qmm.grouped_quantized_matmul(x, members, 32, 4)
        assert [o.shape for o in outs] == [(1, 1, 256), (1, 1, 128), (1, 1, 128)]
    assert len(checked) == 3, "each member checked once, on the first call"
    assert len(launches) == 3 and all(len(c["output_shapes"]) == 3 for c in launches)
    w, s, b = members[1]
    bad = [members[0], (w, s[:, :1], b[:, :1])]  # scales for a K of 32
    known = len(cuda_qmm._CHECKED)
    with pytest.raises(ValueError, match="do not agree"):
        cuda_qmm.grouped_quantized_matmul(x, bad, 32, 4)
    assert len(cuda_qmm._CHECKED) == known, "nothing remembered for the failed signature"


class _Recorder:
    """Stands in for an mx.fast.cuda_kernel: keeps each call, returns zeros of the right shape."""

    def __init__(self):
        self.calls = []

    def __call__(self, **kw):
        self.calls.append(kw)
        return [mx.zeros(kw["output_shapes"][0], kw["output_dtypes"][0])]


def test_linear_hands_mlx_what_gemm_does(monkeypatch):
    """The nn.Linear fast path (hopper.linear, which the backend's linear takes without a
    bias) makes the very call gemm(x, w, b_kn=False) makes: kernel, template, grid, inputs and
    output, for 2-D and 3-D activations on both sides of the few-row and prefill switches; a
    bias still goes through gemm."""
    rec = _Recorder()
    monkeypatch.setattr(hopper, "kernel", lambda spec, rec=rec: rec)
    monkeypatch.setattr(hopper, "prepare", lambda *a: True)
    monkeypatch.setattr(hopper, "available", lambda: True)
    monkeypatch.setattr(hopper, "_PLANS", type(hopper._PLANS)())
    w = mx.zeros((40, 64), mx.bfloat16)

    def call(fn, x):
        n = len(rec.calls)
        out = fn(x)
        assert len(rec.calls) == n + 1
        c = rec.calls[-1]
        shapes = [tuple(i.shape) for i in c["inputs"]]
        return out.shape, shapes, c["template"], c["grid"], c["threadgroup"], c["output_shapes"]

    gemm, through_gemm = hopper.gemm, []
    monkeypatch.setattr(hopper, "gemm", lambda *a, **k: through_gemm.append(1) or gemm(*a, **k))
    for m in (1, 7, 8, 9, 16, 17, 64, 65, 300):
        for x in (mx.zeros((m, 64), mx.bfloat16), mx.zeros((1, m, 64), mx.bfloat16)):
            want = call(lambda x: gemm(x, w, b_kn=False), x)
            assert call(lambda x: hopper.linear(x, w), x) == want, (m, x.ndim)
            assert call(lambda x: cuda_gemm.linear(x, w), x) == want, (m, x.ndim)
    assert not through_gemm  # the fast path ran, not gemm behind it
    bias = mx.zeros((40,), mx.bfloat16)
    x = mx.zeros((3, 64), mx.bfloat16)
    assert call(lambda x: cuda_gemm.linear(x, w, bias), x)[1] == [(3, 64), (40, 64), (3, 40)]
    assert through_gemm == [1]


def test_grouped_linear_plans_one_launch_where_the_widths_allow(monkeypatch):
    """What the grouped entry hands MLX, on any machine: one call with the activation and every
    weight, one output per weight in the activation's leading shape, a grid of the weights'
    column tiles laid end to end times the row tiles, the configuration whose columns divide
    every width; and no grouped launch past 16 rows, for mixed K or dtypes, a group of one or
    four, or widths no block size divides."""
    rec = _Recorder()
    names = []

    def record(**kw):
        rec.calls.append(kw)
        return [
            mx.zeros(s, d) for s, d in zip(kw["output_shapes"], kw["output_dtypes"], strict=True)
        ]

    monkeypatch.setattr(hopper, "kernel", lambda sp: names.append(sp.name) or record)
    monkeypatch.setattr(hopper, "prepare_group", lambda *a: True)
    monkeypatch.setattr(hopper, "_GROUPS", type(hopper._GROUPS)())
    monkeypatch.delenv(hopper.NARROW_ENV, raising=False)
    monkeypatch.delenv(hopper.ENV, raising=False)
    ws = [mx.zeros((n, 64), mx.bfloat16) for n in (2048, 1024, 1024)]
    x = mx.zeros((1, 3, 64), mx.bfloat16)
    outs = hopper.grouped_linear(x, ws)
    assert [o.shape for o in outs] == [(1, 3, 2048), (1, 3, 1024), (1, 3, 1024)]
    c = rec.calls[-1]
    assert [tuple(i.shape) for i in c["inputs"]] == [(1, 3, 64), (2048, 64), (1024, 64), (1024, 64)]
    cfg = hopper.group_config((2048, 1024, 1024))
    assert cfg == hopper.pick_narrow(4096)
    assert c["grid"] == ((4096 // cfg.bn) * cfg.threads, 1, 1)
    assert c["threadgroup"] == (cfg.threads, 1, 1)
    assert names[-1] == f"{hopper.ENTRY}_g3"
    assert hopper.group_config((72, 40)) is None  # no block width divides both
    assert hopper.group_config((896, 128, 128)) == hopper.pick_narrow(1152)
    wide = hopper.group_config((6144, 6144))  # gate/up: the pick for 12288 columns
    assert wide == hopper.pick_narrow(12288) and 6144 % wide.bn == 0
    n = len(rec.calls)
    odd = [mx.zeros((72, 64), mx.bfloat16), mx.zeros((40, 64), mx.bfloat16)]
    for args in (
        (mx.zeros((17, 64), mx.bfloat16), ws),  # past the few-row kernel
        (x, [ws[0], mx.zeros((1024, 32), mx.bfloat16)]),  # another K
        (x, [ws[0], mx.zeros((1024, 64), mx.float16)]),  # another dtype
        (x, ws[:1]),  # a group of one
        (x, [*ws, ws[0]]),  # of four
        (x, odd),  # widths no block size divides
    ):
        assert hopper.grouped_linear(*args) is None
    assert len(rec.calls) == n, "none of those launched"


def test_launch_plans_on_any_machine(monkeypatch):
    """What a call hands MLX: the configuration's grid and template, inputs as (M, K) and
    (N, K) views, a bias broadcast without a copy, the caller's leading shape restored."""
    rec = _Recorder()
    for mod in (hopper, hopper_qmm):
        monkeypatch.setattr(mod, "kernel", lambda spec, rec=rec: rec)
        monkeypatch.setattr(mod, "prepare", lambda *a: True)
    monkeypatch.setattr(hopper, "_PLANS", type(hopper._PLANS)())
    monkeypatch.setattr(hopper_qmm, "_PLANS", type(hopper_qmm._PLANS)())
    x = mx.zeros((2, 3, 64), mx.bfloat16)
    w = mx.zeros((40, 64), mx.bfloat16)
    bias = mx.zeros((40,), mx.bfloat16)
    assert hopper.gemm(x, w, b_kn=False, c=bias).shape == (2, 3, 40)
    call = rec.calls[-1]
    cfg = hopper.choose_config(6, 40, 64)
    assert call["grid"] == (cfg.blocks(6, 40) * cfg.threads, 1, 1)
    assert call["threadgroup"] == (cfg.threads, 1, 1)
    assert cfg.narrow  # six rows: the few-row kernel
    assert set(cfg.template()) <= set(call["template"]) and dict(call["template"])["HAS_C"]
    assert [tuple(i.shape) for i in call["inputs"]] == [(6, 64), (40, 64), (6, 40)]
    assert hopper.gemm(x, w.T, b_kn=True).shape == (2, 3, 40)
    assert tuple(rec.calls[-1]["inputs"][1].shape) == (40, 64)  # W.T is read as W
    n_calls = len(rec.calls)
    hopper.gemm(x, w, b_kn=False, c=bias)  # the plan is reused, the call still made
    assert len(rec.calls) == n_calls + 1 and len(hopper._PLANS) == 2
    wq, sc, bi = mx.quantize(mx.zeros((64, 128)), 64, 4)
    sc, bi = sc.astype(mx.bfloat16), bi.astype(mx.bfloat16)
    out = hopper_qmm.quantized_matmul(mx.zeros((2, 3, 128), mx.bfloat16), wq, sc, bi, 64, 4)
    assert out.shape == (2, 3, 64)
    assert dict(rec.calls[-1]["template"])["BITS"] == 4


def test_the_backends_quantized_matmul_keeps_hopper_plans_in_its_own_table(monkeypatch):
    """On Hopper the backend's quantized_matmul (qmm.py) hands MLX the call hopper_qmm makes
    (kernel inputs, template, grid, output, 2-D and 3-D, few rows and many), through a plan it
    keeps in its own table: a repeated call builds nothing (one lookup); float32 activations
    still take the dequantise-then-GEMM path."""
    from bi_rl.backends.cuda import qmm

    rec = _Recorder()
    monkeypatch.setattr(hopper_qmm, "kernel", lambda spec, rec=rec: rec)
    monkeypatch.setattr(hopper_qmm, "prepare", lambda *a: True)
    monkeypatch.setattr(hopper, "available", lambda: True)
    monkeypatch.setattr(hopper_qmm, "_PLANS", type(hopper_qmm._PLANS)())
    monkeypatch.setattr(qmm, "_PLANS", type(qmm._PLANS)())
    built = []
    real = hopper_qmm._plan
    monkeypatch.setattr(hopper_qmm, "_plan", lambda *a: built.append(1) or real(*a))
    wq, sc, bi = mx.quantize(mx.zeros((64, 128)), 64, 4)
    sc, bi = sc.astype(mx.bfloat16), bi.astype(mx.bfloat16)

    def call(fn, x):
        out = fn(x)
        c = rec.calls[-1]
        shapes = [tuple(i.shape) for i in c["inputs"]]
        return out.shape, shapes, c["template"], c["grid"], c["threadgroup"], c["output_shapes"]

    for m in (1, 16, 17, 300):
        for x in (mx.zeros((m, 128), mx.bfloat16), mx.zeros((1, m, 128), mx.bfloat16)):
            want = call(lambda x: hopper_qmm.quantized_matmul(x, wq, sc, bi, 64, 4), x)
            got = call(lambda x: qmm.quantized_matmul(x, wq, sc, bi, True, 64, 4), x)
            assert got == want, (m, x.ndim)
            sig = next(s for s in qmm._PLANS if s[1] == x.shape)
            assert type(qmm._PLANS[sig]) is hopper_qmm.Plan
            n, calls = len(built), len(rec.calls)
            qmm.quantized_matmul(x, wq, sc, bi, True, 64, 4)
            assert len(built) == n and len(rec.calls) == calls + 1
    f32 = []
    monkeypatch.setattr(qmm, "linear", lambda x, w: f32.append(w.dtype) or x @ w.T)
    calls = len(rec.calls)
    out = qmm.quantized_matmul(mx.zeros((2, 128), mx.float32), wq, sc, bi, True, 64, 4)
    assert out.shape == (2, 64) and f32 == [mx.float32] and len(rec.calls) == calls


@on_hopper
@pytest.mark.parametrize("rows", [14134, 14135, 28672])
def test_outputs_past_2_31_elements_keep_each_rows_bits(rows):
    """A 151936-column head at 14134 rows (just under 2**31 outputs), 14135 (just over) and
    28672 (past 2**32), in the mode, bf16 and 4-bit: the last 64 rows bit for bit those rows
    computed alone (stock MLX's CUDA quantized matmul fails to launch from 14135 rows here:
    its output is indexed in 32 bits), and the first row too."""
    from bi_rl import batch_invariant_mode

    n, k = 151936, 64
    w = rand((n, k), mx.bfloat16, 7, 0.5)
    wq, s, b = mx.quantize(w, group_size=64, bits=4)
    x = rand((rows, k), mx.bfloat16, 8)
    with batch_invariant_mode():
        for name, f in (
            ("bf16", lambda a: a @ w.T),
            ("4-bit", lambda a: mx.quantized_matmul(a, wq, s, b, True, 64, 4)),
        ):
            whole = f(x)
            mx.eval(whole)
            for part in (slice(rows - 64, rows), slice(0, 1)):
                alone = f(x[part])
                assert np.array_equal(bits(whole[part]), bits(alone)), (name, rows, part)
            del whole
