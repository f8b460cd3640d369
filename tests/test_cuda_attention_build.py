"""The CUDA attention kernels (bi_rl/backends/cuda/attention.py) checked without a GPU.

Properties: every configuration's dynamic shared memory fits one block (227 KB) at every head
dim, the float32 kernel's static arrays fit the static limit, and the dispatcher's plans stay
inside that; the kernels, as MLX will be given them, compile for sm_90 with nvcc (where it is
installed) with no spills: head dim 256 in every configuration (the layout that keeps its
registers under 255), the float32 and combine kernels, and the window and ring variants at
every head dim. The one instantiation family that spills (head dim 128 with an additive mask
and sinks) spilled before windows and rings existed; it is listed, and the list is checked to
be exact.
"""

from __future__ import annotations

import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor

import mlx.core as mx
import pytest

from bi_rl._source import kernel_source
from bi_rl.backends.cuda import attention as A
from bi_rl.backends.cuda import mlx_jit, nvrtc

NVCC = shutil.which("nvcc")
has_nvcc = pytest.mark.skipif(NVCC is None, reason="needs nvcc")

# What the kernels need of MLX's device header (mlx/backend/cuda/device/utils.cuh): the CUDA
# half types, cuda::std::numeric_limits, fixed-width ints, and the Shape / Strides structs.
UTILS = (
    """#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda/std/limits>
#include <cstdint>
"""
    + mlx_jit.SHAPE_STRUCTS
)

# (head dim, mask kind, sinks): D = 128 with an additive mask and sinks sits at 255 registers
# and spills a few dozen bytes; before windows and rings existed it already did so in five of
# the six configurations (docs/cuda-design.md), and with a ring and a window the split-mode
# ones spill too.
KNOWN_SPILLS = {(128, A.ADDITIVE, True)}


def test_every_configuration_fits_in_shared_memory():
    for d in A.HEAD_DIMS:
        for cfg in A.configs():
            assert cfg.shared_memory(d) <= A.MAX_SHARED, (d, cfg, cfg.shared_memory(d))
        for b, rows, tk in ((1, 1, 100), (64, 7, 40000), (1, 4096 * 7, 4096)):
            assert A.choose_config(b, 2, rows, tk, d).shared_memory(d) <= A.MAX_SHARED
        assert 4 * d * 4 <= 48 * 1024  # attention_f32's static query rows


@pytest.mark.parametrize("size", [256, 512])
def test_split_mode_takes_more_splits_a_block_only_where_blocks_remain(size):
    """Splits per block: the longest run where few rows decode over long keys (a small grid
    that keeps SMALL_GRID_BLOCKS blocks), 1 as the batch grows past it, more as it grows
    further; always a value configs() tests, and only in split mode. At 256 and at 512 keys a
    split."""
    picks = {}
    tested = {c.splits_per_block for c in A.configs(size) if c.split}
    for b in (1, 8, 32, 64):
        for tk in (512, 8192, 32768, 65536, 131072):
            cfg = A.choose_config(b, 8, 2, tk, 128, size)
            picks[b, tk] = cfg.splits_per_block
            assert cfg.splits_per_block in tested
            assert cfg.split or cfg.splits_per_block == 1
            groups, nsplit = b * 8, A.cdiv(tk, size)
            if cfg.split and groups * nsplit * size <= A.SMALL_GRID_KEYS:
                assert groups * A.cdiv(nsplit, cfg.splits_per_block) >= A.SMALL_GRID_BLOCKS
            elif cfg.split and cfg.splits_per_block > 1:  # at least SPLIT_BLOCKS blocks remain
                assert groups * A.cdiv(nsplit, cfg.splits_per_block) >= A.SPLIT_BLOCKS
    if size == 256:
        assert picks[1, 32768] == 16 and picks[1, 131072] == 16  # 64 and 256 blocks
        assert picks[8, 32768] == 4 and picks[64, 32768] == 16 and picks[64, 131072] == 16
    else:  # split mode from 16384 keys, as at 256
        assert picks[1, 8192] == 1 and not A.choose_config(1, 8, 2, 8192, 128).split
        assert picks[1, 32768] == 8 and picks[1, 131072] == 8  # 64 and 256 blocks
        assert picks[8, 65536] == 2 and picks[64, 65536] == 8 and picks[64, 131072] == 8


def test_small_grids_switch_exactly_at_their_edges():
    """Both sides of the small-grid rule at 256 keys a split: 16 splits a block up to 4096
    splits (SMALL_GRID_KEYS) in all, back to the SPLIT_BLOCKS rule (here 1) one split above;
    and only while 16 a block leaves SMALL_GRID_BLOCKS blocks (8 groups over 81 splits:
    8 x 6 = 48; over 80: 8 x 5). 512's edges: the test below."""
    assert A.SMALL_GRID_KEYS == 4096 * 256 and A.SMALL_GRID_BLOCKS == 48
    pick = lambda b, hkv, tk: A.choose_config(b, hkv, 2, tk, 128, 256)
    assert pick(1, 16, 256 * 256).splits_per_block == 16  # 16 x 256 = 4096 splits
    assert pick(1, 16, 256 * 256 + 1).splits_per_block == 1  # 16 x 257
    assert pick(1, 48, 64 * 256).splits_per_block == 16  # 48 x 64 = 3072 splits, 192 blocks
    assert pick(1, 8, 81 * 256).splits_per_block == 16  # 8 groups x cdiv(81, 16) = 48 blocks
    assert pick(1, 8, 80 * 256).splits_per_block == 1  # 8 x 5 = 40 blocks
    assert pick(1, 8, 80 * 256).split  # split mode all the same, one split a block


@pytest.mark.parametrize("size", [256, 512, 1024])
def test_every_pick_at_every_split_size_is_a_tested_configuration(size):
    """At each split size, whatever splits a block choose_config picks is one of the values
    configs(size) forces in the GPU tests (which take the process's size), and configs
    covers every step of the ladder."""
    tested = {c.splits_per_block for c in A.configs(size) if c.split}
    assert tested == set(A.splits_per_block_steps(size)), size
    for b in (1, 2, 8, 32, 64, 128):
        for tk in (512, 8192, 32768, 65536, 131072, 262144):
            cfg = A.choose_config(b, 8, 2, tk, 128, size)
            assert cfg.splits_per_block in tested and (cfg.split or cfg.splits_per_block == 1)


def test_a_longer_split_gets_the_same_blocks_of_keys():
    """Splits a block are counted in keys: at 512 keys a split a block reduces the keys it
    reduces at 256 wherever both sizes are in split mode (B = 1 over 32768 keys: 8 splits of
    512, 64 blocks, as 16 of 256), and the small-grid rule switches at the same number of
    keys in all (16 groups over 1,048,576 keys: the longest run; one split more: the
    SPLIT_BLOCKS rule, here one split a block)."""
    assert A.splits_per_block_steps(256) == (1, 4, 16)
    assert A.splits_per_block_steps(512) == (1, 2, 8)
    assert A.splits_per_block_steps(1024) == (1, 4)
    both = 0
    for b in (1, 2, 8, 32, 64, 128):
        for tk in (32768, 65536, 131072, 262144):
            short, long = (A.choose_config(b, 8, 2, tk, 128, k) for k in (256, 512))
            if short.split and long.split:
                both += 1
                assert short.splits_per_block * 256 == long.splits_per_block * 512, (b, tk)
    assert both >= 20
    assert A.choose_config(1, 8, 2, 32768, 128, 512).splits_per_block == 8
    pick = lambda tk: A.choose_config(1, 16, 2, tk, 128, 512)
    assert pick(128 * 512).splits_per_block == 8  # 16 x 128 splits of 512 = 2**20 keys
    assert pick(128 * 512 + 1).splits_per_block == 1  # 16 x cdiv(129, 2) = 1040 blocks
    # ... and only while 8 a block leaves SMALL_GRID_BLOCKS blocks (8 groups over 41 splits
    # of 512: 8 x 6 = 48; over 40: 8 x 5)
    small = lambda tk: A.choose_config(1, 8, 2, tk, 128, 512)
    assert small(64 * 512).split and small(64 * 512).splits_per_block == 8  # 8 x 8 blocks
    assert A.choose_config(6, 1, 2, 64 * 512, 128, 512).splits_per_block == 8  # 6 x 8 = 48
    assert A.choose_config(5, 1, 2, 64 * 512, 128, 512).splits_per_block == 1  # 5 x 8 = 40


@pytest.mark.parametrize(("size", "groups", "middle", "most"), [(256, 128, 4, 16), (512, 64, 2, 8)])
def test_splits_per_block_switch_exactly_at_split_blocks(size, groups, middle, most):
    """Both sides of each switch, at 256 and at 512 keys a split: the middle number of splits
    a block from the first grid that still has SPLIT_BLOCKS blocks with it (`groups`
    one-group rows x 64 splits / middle), the most likewise (groups x 256 / most); one group
    fewer keeps the smaller value."""
    assert A.SPLIT_BLOCKS == 2048
    pick = lambda b, splits: A.choose_config(b, 1, 2, splits * size, 128, size)
    assert pick(groups - 1, 64).split and pick(groups - 1, 64).splits_per_block == 1
    assert pick(groups, 64).splits_per_block == middle
    assert pick(groups - 1, 256).splits_per_block == middle
    assert pick(groups, 256).splits_per_block == most
    assert pick(groups, 240).splits_per_block == middle  # groups x cdiv(240, most) = 1920 blocks


def test_head_dim_256_layout_is_what_the_kernel_declares():
    """The Python mirror of the kernel's D = 256 choices (ATT_Q_IN_SMEM, ATT_VALUE_COLS)."""
    src = kernel_source("cuda/attention.cu")
    assert "constexpr bool ATT_Q_IN_SMEM = D > 128;" in src
    assert "constexpr int ATT_VALUE_COLS = D > 128 ? D / 2 : D;" in src
    assert [A.q_in_smem(d) for d in A.HEAD_DIMS] == [False] * 4 + [True]
    assert [A.value_cols(d) for d in A.HEAD_DIMS] == [64, 80, 96, 128, 128]
    k, v, q = 3 * 64 * 264 * 2, 3 * 64 * 136 * 2, 4 * 16 * 32 * 16
    fold, rows = 64 * 128 * 4, 2 * 16 * 4 * 4
    assert A.AttnConfig(4, 3, False).shared_memory(256) == k + v + q + fold + rows
    assert A.AttnConfig(4, 3, True).shared_memory(256) == k + v + q + rows  # one split a block
    assert "foldbuf + (SPLIT ? 0 : (DV / 2) * NTHR)" in src  # the kernel leaves it out alike


def test_split_decode_fits_three_blocks_per_multiprocessor():
    """Decode at head dim 128 in split mode (one warp, two stages): without the fold buffer a
    block needs 68.1 KiB, so three fit in the H100/H200's 228 KiB with their 1 KiB reserve."""
    cfg = A.AttnConfig(1, 2, True)
    assert 3 * (cfg.shared_memory(128) + 1024) <= 228 * 1024
    assert 3 * (A.AttnConfig(1, 2, False).shared_memory(128) + 1024) > 228 * 1024


def half_case(dt, d, cfg, kind, sinks, ring, window):
    has_mask = kind >= A.BOOL_MASK
    ins = [(dt, 4)] * 3
    ins += [(mx.bool_ if kind == A.BOOL_MASK else dt, 4)] if has_mask else []
    ins += [(dt, 1)] if sinks else []
    ins += [(mx.int32, 1)] if ring else []
    return (
        f"D={d} {cfg} mask={kind} sinks={sinks} ring={ring} window={window} {dt}",
        A.kernel_spec(has_mask, sinks, cfg.split, cfg.shared_memory(d), ring),
        ins,
        [mx.float32] if cfg.split else [dt],
        A.template_args(dt, d, cfg, kind, sinks, d**-0.5, window),
    )


def f32_case(d, kind, sinks, ring, window):
    has_mask = kind >= A.BOOL_MASK
    ins = [(mx.float32, 4)] * 3
    ins += [(mx.bool_ if kind == A.BOOL_MASK else mx.float32, 4)] if has_mask else []
    ins += [(mx.float32, 1)] if sinks else []
    ins += [(mx.int32, 1)] if ring else []
    return (
        f"f32 D={d} mask={kind} sinks={sinks} ring={ring} window={window}",
        A.f32_spec(has_mask, sinks, ring),
        ins,
        [mx.float32],
        A.f32_template_args(d, kind, sinks, d**-0.5, window),
    )


def combine_case(dt, d):
    return (
        f"combine D={d} {dt}",
        A.combine_spec(True),
        [(mx.float32, 3), (dt, 4), (dt, 1)],
        [dt],
        A.combine_template_args(dt, d, True),
    )


def compile_all(cases, tmp_path):
    """nvcc each case's translation unit (as MLX renders it) for sm_90; (label, Compiled)."""
    inc = tmp_path / "mlx" / "backend" / "cuda" / "device"
    inc.mkdir(parents=True)
    (inc / "utils.cuh").write_text(UTILS)

    def one(item):
        i, (label, spec, ins, outs, template) = item
        src = tmp_path / f"k{i}.cu"
        src.write_text(mlx_jit.render(spec, spec.header(inline=True), ins, outs, template))
        cmd = [NVCC, "-c", "-std=c++17", "-gencode=arch=compute_90,code=sm_90", "-Xptxas", "-v"]
        r = subprocess.run(
            [*cmd, f"-I{tmp_path}", "-o", str(src.with_suffix(".o")), str(src)],
            capture_output=True,
            text=True,
        )
        assert r.returncode == 0, f"{label} does not compile:\n{r.stderr[-3000:]}"
        return label, nvrtc.Compiled(b"", r.stderr, None)

    with ThreadPoolExecutor(2) as pool:
        return list(pool.map(one, enumerate(cases)))


@has_nvcc
def test_head_dim_256_float32_and_combine_compile_without_spills(tmp_path):
    """The heaviest D = 256 instantiation (sequential, 3 stages, additive mask, sinks, ring,
    window), the float32 kernel and the combine kernel at D = 256."""
    cases = [
        half_case(mx.bfloat16, 256, A.AttnConfig(1, 3, False), A.ADDITIVE, True, True, 100),
        f32_case(256, A.ADDITIVE, True, True, 100),
        combine_case(mx.bfloat16, 256),
    ]
    for label, built in compile_all(cases, tmp_path):
        assert not built.spills, f"{label} spills: {built.log}"
        assert 0 < built.registers <= 255, label


@has_nvcc
@pytest.mark.slow
def test_every_new_instantiation_compiles(tmp_path):
    """Every configuration at D = 256 (both half types), and windows and rings at every head
    dim, for every mask kind; spills only where KNOWN_SPILLS says, and there they do."""
    cases, expect = [], []
    for d in A.HEAD_DIMS:
        dts = (mx.bfloat16, mx.float16) if d == 256 else (mx.bfloat16,)
        for dt in dts:
            for cfg in A.configs():
                for kind in (A.CAUSAL, A.BOOL_MASK, A.ADDITIVE):
                    sinks = kind == A.ADDITIVE
                    both = d == 256 and dt == mx.bfloat16
                    for ring, window in ((False, 0), (True, 1000)) if both else ((True, 1000),):
                        cases.append(half_case(dt, d, cfg, kind, sinks, ring, window))
                        expect.append((d, kind, sinks) in KNOWN_SPILLS)
        cases += [f32_case(d, A.CAUSAL, False, True, 1000), f32_case(d, A.ADDITIVE, True, True, 7)]
        cases.append(combine_case(mx.float16, d))
        expect += [False] * 3
    built = compile_all(cases, tmp_path)
    for (label, b), spills in zip(built, expect, strict=True):
        assert b.spills == spills, f"{label}: spills={b.spills}, expected {spills}: {b.log}"


# -- the split size (BI_RL_ATTN_SPLIT): 512 unless named ---------------------------------------


def test_the_split_size_is_512_unless_the_variable_names_another(monkeypatch):
    from bi_rl import _split

    monkeypatch.delenv(_split.SPLIT_ENV, raising=False)
    assert _split.split_keys() == A.KEYS_PER_SPLIT == 512
    for value in ("256", "512", "1024"):
        monkeypatch.setenv(_split.SPLIT_ENV, value)
        assert _split.split_keys() == int(value)
    for value in ("300", "128", "2048", "big"):
        monkeypatch.setenv(_split.SPLIT_ENV, value)
        with pytest.raises(ValueError, match=rf"BI_RL_ATTN_SPLIT must be one of .*got '{value}'"):
            _split.split_keys()


def test_a_split_size_is_a_define_before_the_files_and_the_default_none():
    """The default's header is the kernel files alone (their own 512); another size defines
    BI_ATT_SPLIT before them and names the kernel apart, in both attention kernels."""
    from bi_rl import _split
    from bi_rl.backends.cuda import hopper_attention as H
    from bi_rl.backends.cuda._kernels import kernel_source

    for default, other in (
        (
            A.kernel_spec(True, False, True, 1024),
            A.kernel_spec(True, False, True, 1024, False, 256),
        ),
        (H.spec(True, 128, 2), H.spec(True, 128, 2, 1024)),
    ):
        assert default.defines == () and "#define" not in default.header(inline=False)
        # ... so the files' own default must be the one bi_rl plans and records
        own = [f for f in default.files if "#define BI_ATT_SPLIT" in kernel_source(f)]
        assert own, default.files
        for f in own:
            assert f"#define BI_ATT_SPLIT {_split.KEYS_PER_SPLIT}\n" in kernel_source(f), f
        keys = other.defines[0].split()[1]
        assert other.defines == (f"BI_ATT_SPLIT {keys}",)
        assert other.header(inline=False).startswith(f"#define BI_ATT_SPLIT {keys}\n")
        assert other.name == default.name + f"_k{keys}" and other.files == default.files


@pytest.mark.parametrize("size", [256, 512, 1024])
def test_split_mode_starts_at_the_same_keys_at_every_split_size(size):
    """Split mode from SPLIT_FROM_KEYS keys counted in whole splits of the size given: the
    first key past the last whole split below it, both sides, at every size (the default's
    edge with no size named)."""
    assert A.SPLIT_FROM_KEYS == 16384
    edge = A.SPLIT_FROM_KEYS - size  # one whole split short
    assert not A.choose_config(1, 8, 2, edge, 128, size).split, size
    assert A.choose_config(1, 8, 2, edge + 1, 128, size).split, size
    if size == A.KEYS_PER_SPLIT:
        assert not A.choose_config(1, 8, 2, edge, 128).split
        assert A.choose_config(1, 8, 2, edge + 1, 128).split


@has_nvcc
def test_other_split_sizes_compile_without_spills(tmp_path):
    """The mma.sync kernel at 256 and 1024 keys a split, sequential and split mode, head dims
    64, 128 and 256: no spills, at most 255 registers."""
    cases = []
    for keys in (256, 1024):
        for d in (64, 128, 256):
            most = A.splits_per_block_steps(keys)[-1]  # the longest run the planner picks
            for cfg in (A.AttnConfig(1, 2, False), A.AttnConfig(2, 3, True, most)):
                label, _, ins, outs, t = half_case(
                    mx.bfloat16, d, cfg, A.BOOL_MASK, False, False, 0
                )
                spec = A.kernel_spec(True, False, cfg.split, cfg.shared_memory(d), False, keys)
                cases.append((f"{label} split {keys}", spec, ins, outs, t))
    for label, built in compile_all(cases, tmp_path):
        assert not built.spills, f"{label} spills: {built.log}"
        assert 0 < built.registers <= 255, label
