"""Batch-invariant bf16/f16 GEMM on Hopper tensor cores (wgmma), for every M.

kernels/cuda/hopper/gemm.cu computes out = alpha * a @ b.T + beta * c with one chain of
warpgroup MMAs per output element over K in increasing order, so row m's bits depend on
(row m of a, b, K) alone; its opening comment says why no tile configuration can change them.

The kernel needs the architecture-specific target sm_90a, which MLX's own kernel compiler does
not use. bi-rl compiles it with NVRTC (`nvrtc.py`, cached on disk) and places the cubin in
MLX's kernel cache under the name MLX gives the kernel (`mlx_jit.py`), then launches it as an
ordinary `mx.fast.cuda_kernel` whose source is a few include lines: MLX's cheapest per-call
path, and the kernel reads every operand through its strides (W.T views, broadcast biases).
Where MLX's cache directory cannot be written, the same device code runs through
`mx.fast.precompiled_cuda_kernel` instead (kernels/cuda/hopper/gemm_entry.cu): same bits,
more host time per call, and operands copied to row-contiguous form.

One configuration (BN columns, NWG warpgroups of 64 rows, STAGES pipeline stages) is picked
per problem size by `choose_config`; every configuration in `configs()` gives the same bits
(the GPU tests compare them), so the choice is about speed only. `configs()` also lists the
few-row kernel's configurations (`NarrowConfig`, kernels/cuda/hopper/gemm_narrow.cu): the
same chain of k16 steps on mma.sync, for decode rows (BI_RL_HOPPER_NARROW=0 turns it off).
"""

from __future__ import annotations

import math
import os
import warnings
from dataclasses import dataclass, replace
from functools import cache, lru_cache

import mlx.core as mx

from bi_rl._source import kernel_source
from bi_rl.backends.base import Unsupported
from bi_rl.backends.cuda import mlx_jit, nvrtc
from bi_rl.backends.cuda._kernels import (
    MAPS_DTYPE,
    KernelSpec,
    Launch,
    Plans,
    bound,
    cdiv,
    float_template,
    gemm_dims,
    kernel,
    rows,
    tma_maps_words,
)

HALF = (mx.bfloat16, mx.float16)
GEMM_FILES = ("cuda/hopper/common.cuh", "cuda/hopper/wgmma_ops.cuh", "cuda/hopper/gemm.cu")
NARROW_FILES = (*GEMM_FILES, "cuda/hopper/gemm_narrow.cu")
NARROW_ENV = "BI_RL_HOPPER_NARROW"  # "0": decode rows (M <= 16) on wgmma, not mma.sync
DEEP_ENV = "BI_RL_HOPPER_DEEP"  # "0": past 64 rows, loads two stages ahead, not three
STAGED_ENV = "BI_RL_HOPPER_STAGED"  # "0": past 64 rows, the epilogue straight from registers
DECODE_ENV = "BI_RL_HOPPER_DECODE_COLUMNS"  # 17-64 rows: columns a block (decode_config)
FILL_ENV = "BI_RL_HOPPER_FILL"  # "0": one block shape per row range, not by output size
TMA_ENV = "BI_RL_HOPPER_TMA"  # "1": past 64 rows, operands copied by TMA (gemm_tma.cu)
TMA_FILES = ("cuda/hopper/tma.cuh", "cuda/hopper/gemm_tma.cu")
ENTRY_FILE = "cuda/hopper/gemm_entry.cu"
ENTRY = "bi_hopper_gemm"
MAX_SHARED = 227 * 1024  # dynamic shared memory a Hopper block may have
ENV = "BI_RL_HOPPER"  # "0": the portable mma.sync kernels on Hopper too; "precompiled": that path
SMS = 132  # multiprocessors of an H100/H200 SXM: the dispatcher sizes grids for it


@dataclass(frozen=True)
class Blocks:
    """What every Hopper kernel configuration has: blocks of rt rows (64 per warpgroup, or
    8/16/32 with one) by bn columns, fed by a stages-deep pipeline of kt 64-wide k-tiles."""

    bn: int
    nwg: int
    stages: int
    rt: int = 0  # 0: 64 * nwg
    kt: int = 1

    def __post_init__(self):
        if not self.rt:
            object.__setattr__(self, "rt", 64 * self.nwg)

    @property
    def threads(self) -> int:
        return 128 * self.nwg

    def blocks(self, m: int, n: int) -> int:
        return cdiv(m, self.rt) * cdiv(n, self.bn)


@dataclass(frozen=True)
class HopperConfig(Blocks):
    """A configuration of the dense GEMM (kernels/cuda/hopper/gemm.cu). deep: loads run
    stages - 1 stages ahead instead of stages - 2, for a second barrier a stage. staged: the
    epilogue writes the tile through shared memory and copies it out in whole rows
    (store_tile_staged; 64 rows a warpgroup only). tma: the operands are copied by TMA from a
    warp of the block's own (kernels/cuda/hopper/gemm_tma.cu: 32 threads more, the loads
    stages ahead); operands TMA cannot read take the deep pipeline inside the same kernel, so
    a tma configuration is a deep one with one k-tile a stage."""

    deep: bool = False
    staged: bool = False
    tma: bool = False

    def __post_init__(self):
        super().__post_init__()
        if self.staged and self.rt != 64 * self.nwg:
            raise ValueError(f"a staged epilogue needs 64 rows a warpgroup, got rt={self.rt}")
        if self.tma and (not self.deep or self.kt != 1 or self.rt != 64 * self.nwg):
            raise ValueError(
                f"TMA copies need the deep pipeline, one k-tile a stage and 64 rows a "
                f"warpgroup, got deep={self.deep}, kt={self.kt}, rt={self.rt}"
            )
        if self.staged and self.rt * (2 * self.bn + 16) > self.stages * self.stage_bytes:
            raise ValueError(f"{self}: the staged tile does not fit in the pipeline's stages")

    @property
    def threads(self) -> int:
        return 128 * self.nwg + (32 if self.tma else 0)

    def scratch_words(self, m: int, n: int) -> int:
        """uint32 words of the tma kernel's maps output over an M x N product (tma_maps_words);
        0 without tma."""
        return tma_maps_words(self.blocks(m, n)) if self.tma else 0

    @property
    def stage_bytes(self) -> int:
        return self.kt * (self.rt + self.bn) * 128

    @property
    def shared_memory(self) -> int:
        """gemm_tma_smem<BN, NWG, STAGES>() with tma (the maps and two mbarriers a stage
        past the stages), else the stages and slack(rt)."""
        if self.tma:
            return 1024 + self.stages * self.stage_bytes + 256 + 16 * self.stages
        return self.stages * self.stage_bytes + slack(self.rt)

    narrow = False  # the wgmma kernel (gemm.cu)

    def template(self) -> list[tuple[str, int]]:
        t = [("BN", self.bn), ("NWG", self.nwg), ("RT", self.rt), ("KT", self.kt)]
        return t + [("STAGES", self.stages)]


@dataclass(frozen=True)
class NarrowConfig:
    """A configuration of the few-row kernel (kernels/cuda/hopper/gemm_narrow.cu): blocks of
    16 rows by 8 nt warps columns, warps warps each running nt 8-column chains, a stages-deep
    pipeline of 64-wide k-tiles. It computes gemm.cu's chains on mma.sync, so it gives the
    bits of every HopperConfig (the GPU tests compare them)."""

    nt: int
    warps: int
    stages: int
    narrow = True
    deep = False
    staged = False
    tma = False
    rt = 16

    def __post_init__(self):
        # gemm.cu's TileLoader, which fills the stages, needs a multiple of 64 threads
        if self.warps < 2 or self.warps % 2:
            raise ValueError(f"a few-row block needs an even number of warps, got {self.warps}")

    @property
    def bn(self) -> int:
        return 8 * self.nt * self.warps

    @property
    def threads(self) -> int:
        return 32 * self.warps

    def blocks(self, m: int, n: int) -> int:
        return cdiv(m, 16) * cdiv(n, self.bn)

    @property
    def shared_memory(self) -> int:
        """gemm_narrow_smem<NT, WARPS, STAGES>() of the kernel."""
        return 1024 + self.stages * (16 * 128 + self.bn * 128)

    def template(self) -> list[tuple[str, int]]:
        return [("NT", self.nt), ("WARPS", self.warps), ("STAGES", self.stages)]


def slack(rt: int) -> int:
    """Shared memory past the stages: 1 KiB to align them to the swizzle period, and with fewer
    than 64 rows per A tile, room for the m64 instruction's reads of the rows it discards."""
    return 1024 + (64 - rt) * 128 if rt < 64 else 1024


def config(bn: int, nwg: int = 1, rt: int = 0, kt: int = 1, stages: int | None = None):
    """A configuration with as many stages as fit (at most 8), or the number given."""
    one = HopperConfig(bn, nwg, 1, rt, kt)
    most = (MAX_SHARED - slack(one.rt)) // one.stage_bytes
    return HopperConfig(bn, nwg, stages or min(8, most), one.rt, kt)


def pick(candidates: list, m: int, n: int, sms: int = SMS):
    """The two-warpgroup configuration for an M x N output past 64 rows among one family's
    candidates (the quantized family; the dense one always takes prefill_config() there).
    Speed only: every candidate gives the same bits. 128 x 256 blocks (the most work per byte
    loaded) once they fill the machine, else 128 x 128.
    """
    two = sorted((c for c in candidates if c.nwg == 2), key=lambda c: -c.bn)
    return first_filling(two, m, n, sms)


def first_filling(candidates: list, m: int, n: int, need: int):
    """The first of `candidates` whose blocks over an M x N output number at least `need`,
    else the last: the dispatchers' one rule, each with its own order and threshold."""
    return next((c for c in candidates if c.blocks(m, n) >= need), candidates[-1])


def configs() -> list:
    """Every configuration the dispatcher can pick (tests compare them bitwise)."""
    prefill = [PREFILL, PREFILL_DEEP, PREFILL_STAGED, PREFILL_DEEP_STAGED, PREFILL_TMA]
    prefill += [MIDDLE, MIDDLE_TMA]
    return [config(bn, 1) for bn in (16, 32, 64, 128, 256)] + prefill + [*NARROW]


# The few-row kernel. A warp runs nt chains of MMAs, each over 8 columns and the whole K, so the
# configurations differ in chains per warp, warps per block and k-tiles in flight: four-warp
# blocks of 64 and 128 columns where they fill the machine; otherwise two-warp blocks of 16
# columns, one chain a warp (as many warps as 32-column four-warp blocks, spread over twice the
# multiprocessors, with 12 stages of weights in flight instead of 8).
NARROW_SPREAD = NarrowConfig(1, 2, 12)  # where four-warp blocks would leave SMs idle
NARROW = [
    NARROW_SPREAD,
    NarrowConfig(2, 4, 6),
    NarrowConfig(4, 4, 4),
]
# Four-warp blocks of 32 columns: the same kernel, not picked (on the H200 the two-warp
# 16-column blocks were faster wherever 64-column blocks leave multiprocessors idle).
NARROW_UNPICKED = NarrowConfig(1, 4, 8)
NARROW_ROWS = 16  # rows up to which the few-row kernel serves, where it is turned on


def narrow_enabled() -> bool:
    """Unless BI_RL_HOPPER_NARROW=0, where launches go through MLX's kernel cache (the
    precompiled launch path has no entry for the few-row kernel)."""
    return os.environ.get(NARROW_ENV, "") != "0" and direct()


def widest_filling(spread, wide, n: int, sms: int = SMS):
    """The widest of the few-row configurations `wide` that still gives every multiprocessor a
    block over n columns, else `spread` (the dense and the quantized few-row kernels' rule)."""
    return first_filling([*sorted(wide, key=lambda c: -c.bn), spread], 1, n, sms)


def pick_narrow(n: int, sms: int = SMS) -> NarrowConfig:
    """The widest four-warp configuration that still gives every multiprocessor a block, else
    two-warp blocks of 16 columns."""
    return widest_filling(NARROW_SPREAD, [c for c in NARROW if c != NARROW_SPREAD], n, sms)


# 17-64 rows (decode at a batch past the few-row kernel's): one warpgroup, at most 128 columns.
# A block reads its 64-row tile of the activations beside its weight columns, so wider blocks
# read fewer activation bytes per output; but every block runs the whole K as one dependent
# chain of MMAs (no split of K: that would change the bits), so where few blocks cover N the
# chain's latency, not the bytes, sets the time and narrower blocks, which make more chains
# of less work each, finish sooner. The width is the widest of DECODE_WIDTHS that makes at
# least FILL of the multiprocessors' worth of blocks (`filling`), else 16 columns: 16 on a
# 2048-column output, 32 on 4096, 64 on 6144, 128 from 12288 columns (vocabularies too);
# with BI_RL_HOPPER_FILL=0, DECODE's 128 columns at every N.
# Timed as a model runs them, each call waiting for the last (`tools/hopper_ab.py --chain`,
# docs/h200/2026-12-06/s37): on an H100, 16 or 32 columns took 12-23% less time than 128 on
# the 2048- and 4096-column projections, where 128 columns make 16-32 blocks; from 12288
# columns 128 was the fastest. Timed as independent calls, which MLX may run side by side on
# the GPU, the widths had looked alike (docs/h200/2026-12-04/s28).
DECODE = config(128, 1)
DECODE_WIDTHS = [DECODE, config(64, 1), config(32, 1), config(16, 1)]
# Share of the multiprocessors that a configuration's blocks must reach to be picked over the
# next, narrower one (`filling`). Between the chained timings' turning points: 128 x 256
# blocks at 96 blocks (a 512 x 6144 output, 73% of 132) beat 128 x 128 ones, at 64 blocks
# (1024 x 2048) they lost to them.
FILL = 0.7
# Past 64 rows: 128 x 256 blocks wherever they fill the machine (below). On the H200
# they were the fastest candidate, or within 3% of it, at 128-2048 rows on eight model
# projections, also where they make fewer blocks than there are multiprocessors (narrower or
# one-warpgroup blocks fill the machine but do less work per byte of shared memory read;
# docs/h200/2026-12-01/s3). That comparison timed independent calls, which may overlap on
# the GPU; timed as chains, narrower blocks won where these make fewer than about 93 (MIDDLE).
PREFILL = config(256, 2, stages=4)
# The same blocks with their loads a stage further ahead (deep), with the epilogue through
# shared memory (staged), and both: the choice past 64 rows is PREFILL_DEEP_STAGED, without
# the one or the other where BI_RL_HOPPER_DEEP=0 or BI_RL_HOPPER_STAGED=0 (prefill_config).
PREFILL_DEEP = HopperConfig(256, 2, 4, deep=True)
PREFILL_STAGED = HopperConfig(256, 2, 4, staged=True)
PREFILL_DEEP_STAGED = HopperConfig(256, 2, 4, deep=True, staged=True)
# PREFILL_DEEP_STAGED's blocks with their operands copied by TMA (gemm_tma.cu), where
# BI_RL_HOPPER_TMA=1 (prefill_config): the same bits, one warp more a block, no block barrier
# in the main loop.
PREFILL_TMA = HopperConfig(256, 2, 4, deep=True, staged=True, tma=True)
# Past 64 rows where 128 x 256 blocks would leave multiprocessors idle (rescoring or
# prefilling a few hundred tokens): 128 x 128 blocks with the deeper loads, then DECODE's
# 64 x 128 ones, the first of the three whose blocks reach FILL of the multiprocessors
# (`filling`); with BI_RL_HOPPER_FILL=0, 128 x 256 blocks at every M.
# Each block's chain of MMAs over K is the same whatever its shape, so the shorter chains of
# more blocks finish sooner there: on an H100, chained, DECODE's blocks took 30-44% less time
# than 128 x 256 ones at 128-512 rows on the 2048- and 4096-column projections, 128 x 128
# blocks 6-18% less at 1024 x 2048 and 512 x 4096; where 128 x 256 blocks reach FILL they
# were the fastest (docs/h200/2026-12-06/s37). On none of those chained cells was the rule's
# pick slower than 128 x 256 blocks (docs/cuda-design.md, "Block shapes that follow the
# output's size").
MIDDLE = HopperConfig(128, 2, 4, deep=True)
# MIDDLE's blocks with their operands copied by TMA, where BI_RL_HOPPER_TMA=1 (middle_config).
MIDDLE_TMA = HopperConfig(128, 2, 4, deep=True, tma=True)


# 128 x 128 blocks small enough for two to share a multiprocessor (three stages, under half its
# shared memory; at most 128 registers a thread for 2 x 256 threads), so that one block's
# pipeline fill, barriers and epilogue can overlap the other's MMAs, at the price of loading
# a third more bytes per MMA than PREFILL's 128 x 256. In variants(), not picked.
TWO_PER_SM = HopperConfig(128, 2, 3)
TWO_PER_SM_DEEP = HopperConfig(128, 2, 3, deep=True)
SM_SHARED = 228 * 1024  # shared memory of a Hopper multiprocessor
BLOCK_RESERVED = 1024  # of it, reserved by the system for each resident block


def deep_enabled() -> bool:
    """Whether rows past 64 load three stages ahead (the default) or two (BI_RL_HOPPER_DEEP=0)."""
    return os.environ.get(DEEP_ENV, "") != "0"


def staged_enabled() -> bool:
    """Whether rows past 64 store through shared memory (the default; BI_RL_HOPPER_STAGED=0:
    straight from the accumulators)."""
    return os.environ.get(STAGED_ENV, "") != "0"


def tma_enabled() -> bool:
    """Whether rows past 64 are copied by TMA (BI_RL_HOPPER_TMA=1; off by default until timed
    on a device) where the loads run a stage further ahead (TMA copies need that pipeline's
    fallback). ValueError naming the variable for any other value."""
    return switch(TMA_ENV, False)


def middle_config() -> HopperConfig:
    """The 128 x 128 blocks past 64 rows: MIDDLE, copied by TMA where that is turned on."""
    return MIDDLE_TMA if tma_enabled() else MIDDLE


def prefill_config() -> HopperConfig:
    """The configuration past 64 rows: PREFILL's blocks, deep and staged unless turned off,
    copied by TMA where that is turned on (and the loads are deep)."""
    deep = deep_enabled()
    return replace(PREFILL, deep=deep, staged=staged_enabled(), tma=deep and tma_enabled())


def variants() -> list[HopperConfig]:
    """configs() and the kernel's other shapes: fewer rows per block (8, 16, 32: the A tile
    holds only those rows), several k-tiles per stage, two warpgroups on 128 or fewer columns,
    the two-per-multiprocessor blocks (TWO_PER_SM) and the few-row kernel's 32-column four-warp
    blocks. The dispatcher picks none of them (tools/hopper_ab.py times any of them against
    PREFILL), but they give the same bits, so the tests compare them bitwise too."""
    more = [config(32, 1, 8, 4), config(16, 1, 16, 4), config(64, 1, 32, 2), config(64, 1, 64, 2)]
    two = [TWO_PER_SM, TWO_PER_SM_DEEP]
    return (
        configs() + [config(128, 2), config(64, 2), config(32, 2)] + more + two + [NARROW_UNPICKED]
    )


def switch(name: str, default: bool) -> bool:
    """A setting that is "0" (off), "1" (on) or unset (`default`); ValueError naming the
    variable for any other value, which the commands report before any output."""
    value = os.environ.get(name, "")
    if value not in ("", "0", "1"):
        raise ValueError(f"{name} must be 0 or 1 (or unset), got {value!r}")
    return default if value == "" else value == "1"


def fill_enabled() -> bool:
    """Whether the block shape follows the output's size (`filling`: the default, or
    BI_RL_HOPPER_FILL=1) or is one per row range, DECODE up to 64 rows and prefill_config()
    past them (BI_RL_HOPPER_FILL=0). The same bits either way. ValueError naming the variable
    for any other value."""
    return switch(FILL_ENV, True)


def fill_need(sms: int = SMS) -> int:
    """The blocks that reach FILL of `sms` multiprocessors."""
    return math.ceil(FILL * sms)


def filling(candidates: list, m: int, n: int, sms: int = SMS):
    """The first of `candidates` (most work a block first) whose blocks over an M x N output
    reach FILL of `sms` multiprocessors (`fill_need`), else the last. Speed only: every
    candidate gives the same bits."""
    return first_filling(candidates, m, n, fill_need(sms))


def decode_config(m: int, n: int) -> HopperConfig:
    """The configuration for 17-64 rows of an M x N output: the widest of DECODE_WIDTHS that
    fills the machine (`filling`), or with BI_RL_HOPPER_FILL=0 DECODE, or
    where BI_RL_HOPPER_DECODE_COLUMNS names a width, the one-warpgroup blocks of that many
    columns among configs() (16, 32, 64, 128 or 256), so that a width can be timed as a whole
    model runs it. Every one gives DECODE's bits. ValueError naming the variable for any
    other value."""
    named = named_decode_width()
    if named is not None:
        return named
    return filling(DECODE_WIDTHS, m, n) if fill_enabled() else DECODE


def named_decode_width() -> HopperConfig | None:
    """The one-warpgroup configuration BI_RL_HOPPER_DECODE_COLUMNS names, None where it is
    unset; ValueError naming the variable for a width outside configs()."""
    value = os.environ.get(DECODE_ENV, "")
    if value == "":
        return None
    widths = {str(c.bn): c for c in configs() if isinstance(c, HopperConfig) and c.nwg == 1}
    if value not in widths:
        raise ValueError(
            f"{DECODE_ENV} must be one of {', '.join(widths)} (or unset), got {value!r}"
        )
    return widths[value]


def check_settings() -> None:
    """ValueError naming the variable where a block-shape setting (BI_RL_HOPPER_FILL,
    BI_RL_HOPPER_TMA, BI_RL_HOPPER_DECODE_COLUMNS) has a value the dispatcher does not take:
    what the commands check before any output, rather than at a run's first product."""
    fill_enabled()
    tma_enabled()
    named_decode_width()


def choose_config(m: int, n: int, k: int):
    """The configuration for a problem size: up to NARROW_ROWS rows the few-row kernel unless
    it is turned off (`narrow_enabled`), up to 64 rows `decode_config()`, past that
    the first of prefill_config() (PREFILL_DEEP_STAGED by default), middle_config() and DECODE that
    fills the machine (`filling`), or with BI_RL_HOPPER_FILL=0 prefill_config() at every M."""
    if m <= NARROW_ROWS and narrow_enabled():
        return pick_narrow(n)
    if m > 64:
        if not fill_enabled():
            return prefill_config()
        return filling([prefill_config(), middle_config(), DECODE], m, n)
    return decode_config(m, n)


@cache
def available() -> bool:
    """Whether this process runs the wgmma kernels: a Hopper GPU, NVRTC, and not disabled."""
    if os.environ.get(ENV, "") == "0" or not mx.cuda.is_available():
        return False
    if nvrtc.nvrtc_module() is None:
        return False
    return arch() == "sm_90a"


@cache
def arch() -> str | None:
    """The architecture to compile for: sm_90a on Hopper, None elsewhere."""
    info = mx.device_info()
    return "sm_90a" if info.get("architecture") == "sm_90" else None


# The kernel body inside MLX's generated function: operands through their strides.
_BODY = """
  const bih::Operand A = bih::operand(a, a_strides[0], a_strides[1], a_shape[0]);
  const bih::Operand B = bih::operand(b, b_strides[0], b_strides[1], b_shape[0]);
  bih::gemm<F16, BN, NWG, RT, KT, STAGES, HAS_C>(A, B, {c}, reinterpret_cast<bih::u16*>(out),
      a_shape[0], b_shape[0], a_shape[1], bih::f32_from_bits(ALPHA_BITS, ALPHA_NEG), {beta});
"""
_C = {
    False: ("nullptr, 0, 0", "0.0f"),
    True: (
        "reinterpret_cast<const bih::u16*>(c), c_strides[0], c_strides[1]",
        "bih::f32_from_bits(BETA_BITS, BETA_NEG)",
    ),
}


# The same kernel for an activation of any rank (..., K), read as rows x K: MLX hands this
# entry row-contiguous operands (spec(..., nd=True)), so a (B, T, K) activation needs no
# reshape on either side of the launch; each reshape is a graph node of its own, host time on
# every decode step.
_BODY_ND = """
  int rows = 1;
  for (int i = 0; i + 1 < a_ndim; ++i) rows *= a_shape[i];
  const int K = a_shape[a_ndim - 1];
  const bih::Operand A = bih::operand(a, K, 1, rows);
  const bih::Operand B = bih::operand(b, K, 1, b_shape[0]);
  bih::gemm<F16, BN, NWG, RT, KT, STAGES, HAS_C>(A, B, nullptr, 0, 0,
      reinterpret_cast<bih::u16*>(out), rows, b_shape[0], K,
      bih::f32_from_bits(ALPHA_BITS, ALPHA_NEG), 0.0f);
"""


_WGMMA_CALL = "bih::gemm<F16, BN, NWG, RT, KT, STAGES, HAS_C>("
_NARROW_CALL = "bih::gemm_narrow<F16, NT, WARPS, STAGES, HAS_C>("
_TMA_CALL = "bih::gemm_tma<F16, BN, NWG, STAGES, HAS_C, {staged}>("
_MAPS_ARG = ", reinterpret_cast<unsigned char*>(maps));"


@cache
def spec(
    has_c: bool,
    shared_memory: int,
    nd: bool = False,
    narrow: bool = False,
    deep: bool = False,
    staged: bool = False,
    tma: bool = False,
) -> KernelSpec:
    """The kernel with or without c; nd (no c): the rank-free entry, a of any rank (..., K)
    and b (N, K) both read as dense row-major; narrow: the few-row kernel, same entries; deep:
    the wgmma kernel with its loads a stage further ahead, same entries; staged: the wgmma
    kernel (deep or not) with its epilogue through shared memory; tma: gemm_tma.cu (deep, with
    or without staged), same entries and a second output, `maps`, its scratch (uint32,
    HopperConfig.scratch_words)."""
    if nd:
        name, source = f"{ENTRY}_nd", _BODY_ND
    else:
        c, beta = _C[has_c]
        name, source = f"{ENTRY}{'_c' if has_c else ''}", _BODY.replace("{c}", c)
        source = source.replace("{beta}", beta)
    outputs, files = ("out",), NARROW_FILES if narrow else GEMM_FILES
    if tma:
        # the call's last argument is followed by the maps; the template names no RT or KT
        call = _TMA_CALL.format(staged="true" if staged else "false")
        name = f"{name}_t{'s' if staged else ''}"
        source = source.replace(_WGMMA_CALL, call)
        cut = source.rindex(");")
        source = source[:cut] + _MAPS_ARG + source[cut + 2 :]
        outputs, files = ("out", "maps"), (*GEMM_FILES, *TMA_FILES)
    elif narrow:
        name, source = f"{name}_n", source.replace(_WGMMA_CALL, _NARROW_CALL)
    elif deep or staged:
        # gemm<..., HAS_C, DEEP[, STAGED]>: the trailing defaults left out, as the plain call does
        flags = (", true" if deep else ", false") + (", true" if staged else "")
        call = _WGMMA_CALL.replace("HAS_C>(", f"HAS_C{flags}>(")
        name = f"{name}{'_d' if deep else ''}{'_s' if staged else ''}"
        source = source.replace(_WGMMA_CALL, call)
    return KernelSpec(
        name=name,
        inputs=("a", "b", "c") if has_c else ("a", "b"),
        outputs=outputs,
        files=files,
        source=source,
        shared_memory=shared_memory,
        row_contiguous=nd,
    )


def cfg_spec(cfg, has_c: bool, nd: bool = False) -> KernelSpec:
    """spec() of the kernel that runs configuration cfg (wgmma, few-row, deep, staged, tma)."""
    return spec(has_c, cfg.shared_memory, nd, cfg.narrow, cfg.deep, cfg.staged, cfg.tma)


def out_dtypes(cfg, dtype) -> tuple:
    """The dtypes of the outputs of cfg's kernel: the product's, and with tma its maps'."""
    return (dtype, MAPS_DTYPE) if cfg.tma else (dtype,)


@lru_cache(maxsize=1024)
def template(dtype, cfg: HopperConfig, has_c: bool, alpha: float, beta: float) -> list:
    t = [("F16", dtype == mx.float16), *cfg.template(), ("HAS_C", has_c)]
    t += float_template("ALPHA", alpha)
    if has_c:
        t += float_template("BETA", beta)
    return t


def _label(dtype, cfg, has_c: bool) -> str:
    name = "f16" if dtype == mx.float16 else "bf16"
    if cfg.narrow:
        shape = f"16x{cfg.bn} mma.sync w{cfg.warps} x{cfg.stages}"
    else:
        shape = f"{cfg.rt}x{cfg.bn} k{cfg.kt * 64} x{cfg.stages}" + (" deep" if cfg.deep else "")
        shape += (" staged" if cfg.staged else "") + (" tma" if cfg.tma else "")
    return f"gemm {name} {shape}{' +c' if has_c else ''}"


def install(sp: KernelSpec, tmpl: list, inputs: tuple, out_dtypes: tuple, label: str) -> bool:
    """Compile an instantiation of a Hopper kernel for sm_90a and place it in MLX's kernel cache,
    where MLX loads it at the kernel's first launch. inputs: (dtype, ndim) of each input, as the
    launch will pass them. False where that cache cannot be written."""
    source = mlx_jit.render(sp, sp.header(), list(inputs), list(out_dtypes), tmpl)
    module = mlx_jit.module_name(sp.name, tmpl, source)
    entry = "mlx::core::cu::" + mlx_jit.kernel_name(sp.name, tmpl)
    built = nvrtc.compile_cubin(
        source, sp.name, "sm_90a", headers=mlx_jit.STAND_IN_HEADERS, names=(entry,), label=label
    )
    if built.spills:
        warnings.warn(f"bi_rl: {label} spills registers: {built.log}", RuntimeWarning, stacklevel=2)
    if mlx_jit.installed(module, built.cubin):
        return True
    try:
        mlx_jit.install(module, entry, built.symbol(entry), built.cubin)
    except OSError as e:
        warnings.warn(
            f"bi_rl: cannot write MLX's kernel cache {mlx_jit.cache_dir()} ({e}); Hopper kernels "
            "run through precompiled_cuda_kernel, which costs more host time per call",
            RuntimeWarning,
            stacklevel=2,
        )
        return False
    return True


def direct() -> bool:
    """Whether launches go through MLX's cuda_kernel (the default) or precompiled launches."""
    return os.environ.get(ENV, "") != "precompiled"


@lru_cache(maxsize=1024)
def prepare(dtype, cfg: HopperConfig, has_c: bool, alpha: float, beta: float, nd=False) -> bool:
    """Compile and install one instantiation; nd: the rank-free entry, whose source MLX renders
    alike for every rank of a."""
    sp = cfg_spec(cfg, has_c, nd)
    tmpl = template(dtype, cfg, has_c, alpha, beta)
    ins = ((dtype, 3 if nd else 2),) + ((dtype, 2),) * (len(sp.inputs) - 1)
    label = _label(dtype, cfg, has_c) + (" nd" if nd else "")
    return install(sp, tmpl, ins, out_dtypes(cfg, dtype), label)


@lru_cache(maxsize=256)
def precompiled_cubin(dtype, cfg: HopperConfig, has_c: bool) -> bytes:
    """The stand-alone entry point's cubin (the fallback launch path; wgmma configurations
    only: `narrow_enabled` keeps the few-row kernel off that path)."""
    if cfg.narrow:
        raise Unsupported(f"{cfg} has no precompiled entry (MLX's kernel cache is not writable)")
    defs = (("F16", int(dtype == mx.float16)), ("BN", cfg.bn), ("NWG", cfg.nwg), ("RT", cfg.rt))
    defs += (("KT", cfg.kt), ("STAGES", cfg.stages), ("HAS_C", int(has_c)))
    defs += (("DEEP", int(cfg.deep)),) + ((("STAGED", 1),) if cfg.staged else ())
    text = "".join(f"#define BIH_{k} {v}\n" for k, v in defs)
    text += "".join(kernel_source(f) for f in (*GEMM_FILES, ENTRY_FILE))
    label = _label(dtype, cfg, has_c) + " (precompiled)"
    return nvrtc.compile_cubin(text, ENTRY, "sm_90a", label=label).cubin


@dataclass(frozen=True)
class _Plan:
    launch: Launch | None  # MLX's cuda_kernel, its cubin placed in MLX's cache; or None:
    cubin: bytes | None  # the precompiled path's code
    cfg: HopperConfig
    m: int
    n: int
    k: int
    lead: tuple | None  # the leading shape to restore; None when a is 2-D or taken as it is
    c_mode: str | None  # None, "row" (a bias: c[n]), "col" (c[m]) or "full" (c[m, n])

    @property
    def grid(self) -> tuple[int, int, int]:
        return (self.cfg.blocks(self.m, self.n) * self.cfg.threads, 1, 1)


_PLANS = Plans()


def _c_mode(c, m: int, n: int) -> str:
    """How c broadcasts against the (M, N) output."""
    shape = tuple(c.shape)
    while len(shape) > 2 and shape[0] == 1:
        shape = shape[1:]
    if len(shape) <= 1 or (len(shape) == 2 and shape[0] == 1):
        return "row" if (shape[-1] if shape else 1) == n else "full"
    if len(shape) == 2 and shape[1] == 1 and shape[0] == m:
        return "col"
    return "full"


def _plan(a, b, b_kn, c, alpha, beta, config) -> _Plan:
    m, n, k = gemm_dims(a, b, b_kn, c, HALF, " on the Hopper path")
    dt = a.dtype
    if max(m, n, k) >= 2**31:
        raise Unsupported(f"matmul dimension past 2^31 (M={m}, N={n}, K={k})")
    cfg = config or choose_config(m, n, k)
    if cfg.tma and not direct():  # the precompiled entry has no TMA copies: the same bits
        cfg = replace(cfg, tma=False)
    if cfg.shared_memory > MAX_SHARED:
        raise ValueError(f"{cfg} needs {cfg.shared_memory} bytes of shared memory")
    has_c = c is not None
    alpha, beta = float(alpha), float(beta) if has_c else 0.0
    lead = None if a.ndim == 2 else (*a.shape[:-1], n)
    launch = None
    # an activation of rank 3 or more times an nn.Linear weight: the rank-free entry takes a
    # and returns out as they are, no reshape either side
    nd = direct() and lead is not None and not has_c and not b_kn
    nd = nd and prepare(dt, cfg, False, alpha, 0.0, True)
    if nd or (direct() and prepare(dt, cfg, has_c, alpha, beta)):
        launch = Launch(
            kernel=kernel(cfg_spec(cfg, has_c, nd)),
            template=template(dt, cfg, has_c, alpha, beta),
            grid=(cfg.blocks(m, n) * cfg.threads, 1, 1),
            group=(cfg.threads, 1, 1),
            out_shape=lead if nd else (m, n),
            out_dtype=dt,
            out_view=None if nd else lead,
            scratch=((cfg.scratch_words(m, n),), MAPS_DTYPE) if cfg.tma else None,
        )
        lead = None if nd else lead
    return _Plan(
        launch=launch,
        cubin=None if launch else precompiled_cubin(dt, cfg, has_c),
        cfg=cfg,
        m=m,
        n=n,
        k=k,
        lead=lead,
        c_mode=None if c is None else _c_mode(c, m, n),
    )


def gemm(
    a, b, *, b_kn: bool, c=None, alpha: float = 1.0, beta: float = 1.0, config=None, poison=None
):
    """a (..., K) times b, where b is (K, N) if b_kn else (N, K); plus beta * c if given.

    config forces a configuration and poison pre-fills the output (tests).
    """
    sig = (a.dtype, a.shape, b.dtype, b.shape, b_kn, alpha, beta, config)
    if c is not None:
        sig += (c.dtype, c.shape)
    p = _PLANS.get(sig) or _PLANS.build(sig, _plan, a, b, b_kn, c, alpha, beta, config)
    a2 = a if p.lead is None else a.reshape(p.m, p.k)
    bnk = b.T if b_kn else b
    if p.launch is not None:
        if c is None:
            return p.launch(a2, bnk, init_value=poison)
        return p.launch(a2, bnk, _broadcast_c(c, p), init_value=poison)
    out = _precompiled(p, a2, bnk, c, alpha, beta, poison)
    return out if p.lead is None else out.reshape(p.lead)


def linear(a, w):
    """a @ w.T for an nn.Linear weight w (N, K) with no bias: `gemm(a, w, b_kn=False)`, the
    same plan and launch, found by a shorter signature (four entries, so it cannot meet one of
    gemm's in the same table). It is a decode step's most frequent call, seven a layer, so
    its host time is the step's."""
    sig = (a.dtype, a.shape, w.dtype, w.shape)
    p = _PLANS.get(sig) or _PLANS.build(sig, _plan, a, w, False, None, 1.0, 1.0, None)
    if p.launch is None or p.lead is not None:  # precompiled, or a reshape either side
        return gemm(a, w, b_kn=False)
    return p.launch(a, w)


def linear_launch(a, w) -> Launch | None:
    """The launch `linear(a, w)` makes for arguments of these shapes and dtypes, a callable of
    (a, w) with its output; None where linear makes another (precompiled, a reshape either
    side, through gemm) or no call has built its plan yet."""
    p = _PLANS.get((a.dtype, a.shape, w.dtype, w.shape))
    return None if p is None or p.launch is None or p.lead is not None else p.launch


# One launch of the few-row kernel over G weights read with one activation (sibling
# projections of a layer: q/k/v, gate/up): block x serves row tile x / T and column tile
# x % T of the weights' T column tiles laid end to end, computed by gemm_narrow exactly as a
# launch over that weight alone computes its tile (the same body, its own operand, output
# and width, the tile's index within it). Every weight's width is a multiple of the block's
# columns, so no tile straddles two weights.
_GROUP_BODY = """
  int rows = 1;
  for (int i = 0; i + 1 < a_ndim; ++i) rows *= a_shape[i];
  const int K = a_shape[a_ndim - 1];
  const bih::Operand A = bih::operand(a, K, 1, rows);
  constexpr int BNB = 8 * NT * WARPS;
  const int n0 = b0_shape[0], n1 = b1_shape[0], n2 = {n2};
  const int t0 = n0 / BNB, t1 = n1 / BNB, tiles = t0 + t1 + n2 / BNB;
  const int mt = blockIdx.x / tiles, ct = blockIdx.x % tiles;
  const void* b = b0;
  bih::u16* o = reinterpret_cast<bih::u16*>(out0);
  int n = n0, c = ct;
  if (ct >= t0 + t1) {{
    {third}
  }} else if (ct >= t0) {{
    b = b1; o = reinterpret_cast<bih::u16*>(out1); n = n1; c = ct - t0;
  }}
  const bih::Operand B = bih::operand(b, K, 1, n);
  bih::gemm_narrow<F16, NT, WARPS, STAGES, false>(A, B, nullptr, 0, 0, o, rows, n, K,
      bih::f32_from_bits(ALPHA_BITS, ALPHA_NEG), 0.0f, mt * (n / BNB) + c);
"""
_THIRD = "b = b2; o = reinterpret_cast<bih::u16*>(out2); n = n2; c = ct - t0 - t1;"
GROUP_SIZES = (2, 3)


@cache
def group_spec(g: int, shared_memory: int) -> KernelSpec:
    """The grouped few-row entry over g weights (GROUP_SIZES): inputs a (any rank, (..., K)),
    b0 .. b{g-1} (N_i, K); outputs out0 .. out{g-1} (..., N_i), all row-contiguous."""
    n2, third = ("b2_shape[0]", _THIRD) if g == 3 else ("0", "")
    return KernelSpec(
        name=f"{ENTRY}_g{g}",
        inputs=("a", *(f"b{i}" for i in range(g))),
        outputs=tuple(f"out{i}" for i in range(g)),
        files=NARROW_FILES,
        source=_GROUP_BODY.format(n2=n2, third=third),
        shared_memory=shared_memory,
        row_contiguous=True,
    )


@lru_cache(maxsize=256)
def prepare_group(dtype, cfg: NarrowConfig, g: int) -> bool:
    """Compile and install the grouped entry for g weights in configuration cfg."""
    sp = group_spec(g, cfg.shared_memory)
    tmpl = template(dtype, cfg, False, 1.0, 0.0)
    ins = ((dtype, 3),) + ((dtype, 2),) * g
    label = _label(dtype, cfg, False) + f" group of {g}"
    return install(sp, tmpl, ins, (dtype,) * g, label)


def group_config(widths: tuple[int, ...]) -> NarrowConfig | None:
    """The few-row configuration for one launch over weights of these widths: the one
    pick_narrow takes for their sum where its columns divide every width, else the widest
    that does; None where none does (the caller launches the weights one by one)."""
    fits = [c for c in NARROW if all(n % c.bn == 0 for n in widths)]
    if not fits:
        return None
    first = pick_narrow(sum(widths))
    return first if first in fits else max(fits, key=lambda c: (c.bn, c.warps))


_GROUPS = Plans()


def _group_plan(a, ws):
    """A launch (a callable of a and the weights) for the grouped few-row kernel, or None."""
    g, dt = len(ws), a.dtype
    if g not in GROUP_SIZES or dt not in HALF or not narrow_enabled() or a.ndim < 2:
        return None
    m, k = rows(a.shape), a.shape[-1]
    if not 1 <= m <= NARROW_ROWS or k >= 2**31:
        return None
    if any(w.ndim != 2 or w.dtype != dt or w.shape[1] != k for w in ws):
        return None
    widths = tuple(w.shape[0] for w in ws)
    cfg = group_config(widths)
    if cfg is None or not prepare_group(dt, cfg, g):
        return None
    tiles = sum(n // cfg.bn for n in widths) * cdiv(m, 16)
    call, tmpl = bound(kernel(group_spec(g, cfg.shared_memory)), template(dt, cfg, False, 1.0, 0.0))
    lead = tuple(a.shape[:-1])
    # Everything but the arrays is fixed by the signature: built once, passed on every call.
    fixed = dict(
        template=tmpl,
        grid=(tiles * cfg.threads, 1, 1),
        threadgroup=(cfg.threads, 1, 1),
        output_shapes=[(*lead, n) for n in widths],
        output_dtypes=[dt] * g,
    )

    def launch(a, ws):
        return call(inputs=[a, *ws], **fixed)

    return launch


def grouped_linear(a, ws):
    """[a @ w.T for w in ws] in one launch of the few-row kernel, each output the bits of
    `linear(a, w)` (the same kernel body over the same tile; every configuration gives the
    same bits); None where that launch does not apply (more than NARROW_ROWS rows, widths no
    block size divides, mixed shapes or dtypes): the caller then launches them one by one."""
    p = group_launch(a, ws)
    return None if p is None else p(a, ws)


def group_launch(a, ws, build: bool = True):
    """grouped_linear's launch for arguments of these shapes, a callable of a and the
    weights, or None where one launch does not apply; build=False: None also where no call
    has built it yet."""
    sig = (a.dtype, a.shape, *[(w.dtype, w.shape) for w in ws])
    p = _GROUPS.get(sig, False)
    if p is False:
        p = _GROUPS.build(sig, _group_plan, a, ws) if build else None
    return p


def _broadcast_c(c, p: _Plan):
    """c as an (M, N) view: a bias row or column is broadcast without a copy."""
    if p.c_mode == "row":
        return mx.broadcast_to(c.reshape(p.n), (p.m, p.n))
    if p.c_mode == "col":
        return mx.broadcast_to(c.reshape(p.m, 1), (p.m, p.n))
    return mx.broadcast_to(c, p.lead or (p.m, p.n)).reshape(p.m, p.n)


def _precompiled(p: _Plan, a, b, c, alpha, beta, poison):
    inputs = [a, b]
    if c is None:
        scalars = [p.m, p.n, p.k, float(alpha)]
    else:
        if p.c_mode == "row":
            inputs.append(c.reshape(p.n))
            ld = (0, 1)
        elif p.c_mode == "col":
            inputs.append(c.reshape(p.m))
            ld = (1, 0)
        else:
            inputs.append(mx.broadcast_to(c, p.lead or (p.m, p.n)).reshape(p.m, p.n))
            ld = (p.n, 1)
        scalars = [p.m, p.n, p.k, *ld, float(alpha), float(beta)]
    return mx.fast.precompiled_cuda_kernel(
        name=ENTRY,
        compiled_source=p.cubin,
        inputs=inputs,
        output_shapes=[(p.m, p.n)],
        output_dtypes=[a.dtype],
        scalars=scalars,
        grid=p.grid,
        threadgroup=(p.cfg.threads, 1, 1),
        shared_memory=p.cfg.shared_memory,
        init_value=poison,
        ensure_row_contiguous=True,
    )[0]
