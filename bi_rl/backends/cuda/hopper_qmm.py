"""Batch-invariant quantized matmul on Hopper tensor cores: x @ dequantize(w).T, bf16/f16 x.

kernels/cuda/hopper/qmm.cu runs the GEMM main loop of gemm.cu with each k-tile's weight tile
dequantised in shared memory from MLX's packed affine format (2/3/4/5/6/8 bits, groups of
32/64/128), so the reduction per output element is the dense kernel's: one wgmma chain over K
in order, the same bits for a row alone or in any batch, for every configuration in
`configs()`. Compiled and launched as hopper.py describes.

Up to 16 rows the few-row kernel serves instead (`QNarrowConfig`,
kernels/cuda/hopper/qmm_narrow.cu): the same chain of k16 steps on mma.sync, each lane
dequantising its own weight fragments with qmm.cu's expression, so the same bits; hopper.py's
BI_RL_HOPPER_NARROW=0 turns it off with the dense one. Where it would run 16-column blocks,
its warp-specialised form serves (`QNarrowWsConfig`, kernels/cuda/hopper/qmm_narrow_ws.cu):
helper warps copy and dequantise the k-tiles in turn while two warps run the chains, the same
values and chains; BI_RL_HOPPER_WS=0 keeps the plain blocks.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from functools import cache, lru_cache

import mlx.core as mx

from bi_rl.backends.base import Unsupported
from bi_rl.backends.cuda import hopper
from bi_rl.backends.cuda._kernels import KernelSpec, Launch, Plans, bound, cdiv, kernel

BITS = (2, 3, 4, 5, 6, 8)
GROUPS = (32, 64, 128)
FILES = (*hopper.GEMM_FILES, "cuda/hopper/qmm.cu")
NARROW_FILES = (*FILES, "cuda/hopper/gemm_narrow.cu", "cuda/hopper/qmm_narrow.cu")
WS_FILES = (*NARROW_FILES, "cuda/hopper/qmm_narrow_ws.cu")


@dataclass(frozen=True)
class QmmConfig(hopper.Blocks):
    """A configuration of the quantized GEMM for one bit width: blocks of rt rows of x by bn
    rows of w."""

    bits: int = field(kw_only=True)
    narrow = False  # the wgmma kernel (qmm.cu)
    helpers = 0

    @property
    def stage_bytes(self) -> int:
        # x tiles, then packed weights (8 * bits bytes a row) and 16 bytes of scales and biases
        # a row, per k-tile; the weight part rounded to the 1024-byte swizzle period
        packed = self.kt * self.bn * (8 * self.bits + 16)
        return self.kt * self.rt * 128 + -(-packed // 1024) * 1024

    @property
    def shared_memory(self) -> int:
        # three rotating buffers of dequantised tiles after the stages
        return self.stages * self.stage_bytes + 3 * self.kt * self.bn * 128 + hopper.slack(self.rt)

    def template(self) -> list[tuple[str, int]]:
        t = [("BN", self.bn), ("NWG", self.nwg), ("RT", self.rt), ("KT", self.kt)]
        return t + [("STAGES", self.stages), ("BITS", self.bits)]


@dataclass(frozen=True)
class QNarrowConfig(hopper.NarrowConfig):
    """A configuration of the few-row quantized kernel (kernels/cuda/hopper/qmm_narrow.cu):
    the dense few-row kernel's blocks (16 rows by 8 nt warps columns, warps warps each running
    nt 8-column chains, a stages-deep pipeline of one 64-wide k-tile a stage) over packed
    weights of `bits` bits. It computes qmm.cu's chains on mma.sync with qmm.cu's dequantised
    values, so it gives the bits of every QmmConfig (the GPU tests compare them)."""

    bits: int = field(kw_only=True)
    kt = 1
    helpers = 0  # QNarrowWsConfig's warps that copy and dequantise

    def __post_init__(self):
        super().__post_init__()
        # the kernel reads a k-tile's fragments one k-tile ahead of its MMAs, so a stage is
        # being read, one is being computed from registers and at least one is loading
        if self.stages < 3:
            raise ValueError(f"a few-row quantized block needs 3 stages or more, got {self}")

    @property
    def stage_bytes(self) -> int:
        """x's 16 x 64 tile, then QuantB's one-k-tile stage: the packed rows and 16 bytes of
        scales and biases a row, rounded to 1024 bytes."""
        return 16 * 128 + -(-self.bn * (8 * self.bits + 16) // 1024) * 1024

    @property
    def shared_memory(self) -> int:
        """qmm_narrow_smem<BITS, NT, WARPS, STAGES>() of the kernel."""
        return 1024 + self.stages * self.stage_bytes

    def template(self) -> list[tuple[str, int]]:
        # BN and RT name the block's tile for the grouped entry's tile count
        return super().template() + [("BITS", self.bits), ("BN", self.bn), ("RT", 16)]


@dataclass(frozen=True)
class QNarrowWsConfig(QNarrowConfig):
    """A configuration of the warp-specialised few-row kernel
    (kernels/cuda/hopper/qmm_narrow_ws.cu): QNarrowConfig's blocks of 16 rows by 8 nt warps
    columns, whose `warps` warps only run the chains, while `helpers` more warps take the
    k-tiles in turn, each copying its own (stages in all) and dequantising them into one of
    `slots` buffers of fragments. The chains and the values are QNarrowConfig's, so it gives
    the same bits (the GPU tests compare them)."""

    helpers: int = field(kw_only=True)
    slots: int = field(default=4, kw_only=True)

    def __post_init__(self):
        # each helper has every helpers-th stage and slot, and copies at least one of its
        # turns ahead of the slots
        h = self.helpers
        if self.warps < 1 or h < 1 or self.stages % h or self.slots % h:
            raise ValueError(f"stages and slots must be whole turns of the helpers: {self}")
        if self.stages - self.slots < h:
            raise ValueError(f"a helper needs stages for a turn past its slots: {self}")

    @property
    def threads(self) -> int:
        return 32 * (self.warps + self.helpers)

    @property
    def shared_memory(self) -> int:
        """qmm_narrow_ws_smem<BITS, NT, CW, HW, STAGES, DQS>() of the kernel: the stages, the
        slots of dequantised fragments (128 bytes a column) and two barriers a slot."""
        return super().shared_memory + self.slots * (self.bn * 128 + 16)

    def template(self) -> list[tuple[str, int]]:
        return super().template() + [("HELPERS", self.helpers), ("DQS", self.slots)]


def qconfig(bn: int, nwg: int, bits: int, rt: int = 0, kt: int = 1, stages: int | None = None):
    """A configuration with as many stages as fit (at most 8), or the number given."""
    one = QmmConfig(bn, nwg, 1, rt, kt, bits=bits)
    room = hopper.MAX_SHARED - (one.shared_memory - one.stage_bytes)
    return QmmConfig(bn, nwg, stages or min(8, room // one.stage_bytes), one.rt, kt, bits=bits)


ROW_TILES = (8, 16, 32, 64)
DECODE_STAGES = 6
DECODE_BLOCKS = 512  # the most column blocks a decode-sized product is cut into


def row_tile(m: int) -> int:
    """The smallest row tile holding m rows (up to 64)."""
    return next(r for r in ROW_TILES if r >= m)


@cache
def configs(bits: int) -> list[QmmConfig]:
    """Every configuration the dispatcher can pick for a bit width (tests compare them)."""
    return decode_configs(bits) + wide_configs(bits)


def decode_configs(bits: int) -> list:
    """What `decode_config` returns, for every row tile and both column widths, and the few-row
    configurations `pick_narrow` can return."""
    return group_configs(bits) + [ws_spread(bits)]


def group_configs(bits: int) -> list:
    """The decode configurations the grouped entry takes (`group_config` picks among them):
    all of `decode_configs` but the warp-specialised one."""
    ns = (16, 16 * DECODE_BLOCKS + 1)
    wg = [decode_config(rt, n, bits) for rt in ROW_TILES for n in ns]
    return list(dict.fromkeys(wg)) + narrow_configs(bits)


# The few-row kernel. A warp runs nt chains of MMAs, each over 8 columns and the whole K, and
# dequantises its own fragments of each k-tile, so the configurations differ in chains per
# warp, warps per block and k-tiles in flight: four-warp blocks of 64 and 128 columns where
# they give every multiprocessor a block; otherwise two-warp blocks of 16 columns, one chain a
# warp, with 12 k-tiles in flight (hopper.py's few-row shapes).
NARROW_SHAPES = ((1, 2, 12), (2, 4, 6), (4, 4, 4))  # (nt, warps, stages); the first spreads
NARROW_UNPICKED = (1, 4, 8)  # four-warp blocks of 32 columns: the same kernel, not picked


@cache
def narrow_configs(bits: int) -> list[QNarrowConfig]:
    """The few-row configurations the dispatcher can pick for a bit width."""
    return [QNarrowConfig(nt, w, st, bits=bits) for nt, w, st in NARROW_SHAPES]


def pick_narrow(n: int, bits: int, sms: int = hopper.SMS, ws: bool = True) -> QNarrowConfig:
    """The widest four-warp configuration that still gives every multiprocessor a block, else
    blocks of 16 columns: the warp-specialised ones (`ws_spread`) where the caller's entry has
    them (ws) unless BI_RL_HOPPER_WS=0, else two-warp blocks."""
    spread, *wide = narrow_configs(bits)
    cfg = hopper.widest_filling(spread, wide, n, sms)
    return ws_spread(bits) if cfg == spread and ws and ws_enabled() else cfg


# BI_RL_HOPPER_WS=0: the few-row kernel's 16-column blocks without helper warps
WS_ENV = "BI_RL_HOPPER_WS"


def ws_enabled() -> bool:
    """Whether the dispatcher's 16-column few-row blocks are the warp-specialised ones
    (unless BI_RL_HOPPER_WS=0)."""
    return os.environ.get(WS_ENV, "") != "0"


def ws_spread(bits: int) -> QNarrowWsConfig:
    """The warp-specialised few-row configuration the dispatcher picks where the plain
    kernel's choice would be its two-warp 16-column blocks: two chain warps of one chain each
    beside four helpers (timed faster than those blocks on every output they serve, and slower
    than the four-warp blocks where those are picked: BENCHMARK.md)."""
    return ws_configs(bits)[0]


@cache
def wide_configs(bits: int) -> list[QmmConfig]:
    """The configurations past 64 rows (hopper.pick chooses among them)."""
    small = [qconfig(bn, 1, bits) for bn in (16, 32, 64, 128, 256)]
    large = [qconfig(128, 2, bits, stages=4), qconfig(256, 2, bits)]
    fits = [c for c in small + large if c.stages >= 4]  # the loop needs 2 ahead
    return [c for c in fits if c.shared_memory <= hopper.MAX_SHARED]


def variants(bits: int) -> list[QmmConfig]:
    """configs() and the shapes the dispatcher does not pick (see hopper.variants)."""
    more = [qconfig(32, 1, bits, 8, 4), qconfig(16, 1, bits, 16, 4), qconfig(64, 1, bits, 32, 2)]
    more += [qconfig(16, 1, bits, 8, 1, DECODE_STAGES), *decode_kt_variants(bits)]
    more = [c for c in more if c.stages >= 4 and c not in configs(bits)]
    ws = [c for c in ws_configs(bits) if c not in configs(bits)]
    return configs(bits) + more + [QNarrowConfig(*NARROW_UNPICKED, bits=bits), *ws]


# The warp-specialised few-row kernel: 16-column blocks (two chains) whose chains run on two
# warps of one chain each (the first, which the dispatcher picks: ws_spread) or on one warp of
# two, beside four helper warps that take the k-tiles in turn (each copying its k-tiles three
# turns ahead). (nt, warps, stages, helpers)
WS_SHAPES = ((1, 2, 16, 4), (2, 1, 16, 4))


@cache
def ws_configs(bits: int) -> list[QNarrowWsConfig]:
    """The warp-specialised few-row configurations (in variants(), which the GPU tests
    compare; tools/hopper_ab.py times them against the dispatcher's)."""
    return [QNarrowWsConfig(nt, w, st, bits=bits, helpers=h) for nt, w, st, h in WS_SHAPES]


def decode_kt_variants(bits: int) -> list[QmmConfig]:
    """Decode-sized blocks with 2 or 4 k-tiles a stage (one barrier and one dequantising pass
    per stage, over more k)."""
    out = []
    for rt in ROW_TILES:
        for kt in (2, 4):
            c = qconfig(16, 1, bits, rt, kt, DECODE_STAGES)
            c = c if c.shared_memory <= hopper.MAX_SHARED else qconfig(16, 1, bits, rt, kt, 4)
            if c.shared_memory <= hopper.MAX_SHARED:
                out.append(c)
    return out


def decode_config(m: int, n: int, bits: int) -> QmmConfig:
    """The wgmma configuration for up to 64 rows (see choose_config)."""
    rt = row_tile(m)
    if rt >= 32 and bits <= 4:
        # 17-64 rows of narrow weights: a block re-reads its activation tile for each of its
        # k-tiles' weights, sixteen times the weights' bytes at 16 columns of 4 bits, so
        # wider blocks (64 columns up to 32 rows, 32 at 64 rows, vocabularies too) read less
        # (timed in BENCHMARK.md, twenty-ninth session)
        return qconfig(64 if rt == 32 else 32, 1, bits, rt, 1, DECODE_STAGES)
    if cdiv(n, 16) > DECODE_BLOCKS:
        return qconfig(32, 1, bits, rt, 1, DECODE_STAGES)
    # 8-row tiles take 4 k-tiles a stage: fewer barriers per k (timed faster, BENCHMARK.md)
    return qconfig(16, 1, bits, rt, 4 if rt == 8 else 1, DECODE_STAGES)


def rows_config(m: int, n: int, bits: int, ws: bool = True):
    """The configuration for up to 64 rows: the few-row kernel (`pick_narrow`, its
    warp-specialised form only where ws) up to hopper.NARROW_ROWS rows unless it is turned off
    (`hopper.narrow_enabled`), else the wgmma one (`decode_config`)."""
    if m <= hopper.NARROW_ROWS and hopper.narrow_enabled():
        return pick_narrow(n, bits, ws=ws)
    return decode_config(m, n, bits)


def choose_config(m: int, n: int, k: int, bits: int):
    """Speed only, never bits.

    Up to hopper.NARROW_ROWS rows the few-row kernel (`pick_narrow`) unless it is turned off
    (`hopper.narrow_enabled`). Otherwise, up to 64 rows, a block's time per k-tile grows
    with its width: each k-tile's weights are dequantised into shared memory by the block's
    one warpgroup before its MMAs can read them, so narrow blocks (16 columns, the row tile
    that holds M) finish their chain sooner and more of them run side by side; 32 columns
    where 16 would make more than DECODE_BLOCKS blocks (a vocabulary's logits; the timings
    are in BENCHMARK.md). More rows: hopper.pick over the wide configurations.
    """
    if m <= 64:
        return rows_config(m, n, bits)
    return hopper.pick(wide_configs(bits), m, n)


# Column strides of w, scales and biases are 1 for anything mx.quantize made; the kernel reads
# rows through the row strides.
_BODY = """
  const int K = x_shape[1];
  if (w_strides[1] != 1 || scales_strides[1] != 1 || biases_strides[1] != 1) __trap();
  const bih::Operand X = bih::operand(x, x_strides[0], x_strides[1], x_shape[0]);
  const bih::QuantOperand W{reinterpret_cast<const unsigned char*>(w), w_strides[0] * 4,
      reinterpret_cast<const bih::u16*>(scales), reinterpret_cast<const bih::u16*>(biases),
      scales_strides[0], biases_strides[0],
      (scales_shape[0] - 1) * scales_strides[0] + scales_shape[1],
      (biases_shape[0] - 1) * biases_strides[0] + biases_shape[1],
      __ffs(K / scales_shape[1]) - 1};
  bih::qmm<F16, BN, NWG, RT, KT, STAGES, BITS>(X, W, reinterpret_cast<bih::u16*>(out), x_shape[0],
      w_shape[0], K);
"""


# The same kernel for x of any rank (..., K), every operand read as dense row-major (MLX makes
# them row-contiguous first; spec(..., nd=True)): a (B, T, K) activation needs no reshape
# either side.
_BODY_ND = """
  int rows = 1;
  for (int i = 0; i + 1 < x_ndim; ++i) rows *= x_shape[i];
  const int K = x_shape[x_ndim - 1];
  const bih::Operand X = bih::operand(x, K, 1, rows);
  const bih::QuantOperand W{reinterpret_cast<const unsigned char*>(w), w_shape[1] * 4ll,
      reinterpret_cast<const bih::u16*>(scales), reinterpret_cast<const bih::u16*>(biases),
      scales_shape[1], biases_shape[1], static_cast<long long>(scales_shape[0]) * scales_shape[1],
      static_cast<long long>(biases_shape[0]) * biases_shape[1], __ffs(K / scales_shape[1]) - 1};
  bih::qmm<F16, BN, NWG, RT, KT, STAGES, BITS>(X, W, reinterpret_cast<bih::u16*>(out), rows,
      w_shape[0], K);
"""


_WGMMA_CALL = "bih::qmm<F16, BN, NWG, RT, KT, STAGES, BITS>("
_NARROW_CALL = "bih::qmm_narrow<F16, NT, WARPS, STAGES, BITS>("
_WS_CALL = "bih::qmm_narrow_ws<F16, NT, WARPS, HELPERS, STAGES, DQS, BITS>("


def _narrowed(
    name: str, source: str, narrow: bool, ws: bool = False
) -> tuple[str, str, tuple[str, ...]]:
    """A kernel's name, body and files, for the few-row kernel where narrow, its
    warp-specialised form where ws as well (same entries)."""
    if not narrow:
        return name, source, FILES
    if ws:
        return f"{name}_ws", source.replace(_WGMMA_CALL, _WS_CALL), WS_FILES
    return f"{name}_n", source.replace(_WGMMA_CALL, _NARROW_CALL), NARROW_FILES


@cache
def spec(
    shared_memory: int, nd: bool = False, narrow: bool = False, ws: bool = False
) -> KernelSpec:
    """The kernel; nd: the rank-free entry (x of any rank, every operand row-contiguous);
    narrow: the few-row kernel, ws: its warp-specialised form, same entries."""
    name, source, files = _narrowed(
        "bi_hopper_qmm_nd" if nd else "bi_hopper_qmm", _BODY_ND if nd else _BODY, narrow, ws
    )
    return KernelSpec(
        name=name,
        inputs=("x", "w", "scales", "biases"),
        outputs=("out",),
        files=files,
        source=source,
        shared_memory=shared_memory,
        row_contiguous=nd,
    )


def cfg_spec(cfg, nd: bool = False) -> KernelSpec:
    """`spec` of the kernel a configuration runs."""
    return spec(cfg.shared_memory, nd, cfg.narrow, cfg.helpers > 0)


def template(dtype, cfg) -> list:
    return [("F16", dtype == mx.float16), *cfg.template()]


def _label(dtype, cfg) -> str:
    name = "f16" if dtype == mx.float16 else "bf16"
    if cfg.narrow:
        helpers = f"+{cfg.helpers}h d{cfg.slots}" if cfg.helpers else ""
        return f"qmm {cfg.bits}-bit {name} 16x{cfg.bn} mma.sync w{cfg.warps}{helpers} x{cfg.stages}"
    return f"qmm {cfg.bits}-bit {name} {cfg.rt}x{cfg.bn} k{cfg.kt * 64} x{cfg.stages}"


@lru_cache(maxsize=512)
def prepare(dtype, cfg, nd: bool = False) -> bool:
    inputs = ((dtype, 3 if nd else 2), (mx.uint32, 2), (dtype, 2), (dtype, 2))
    sp = cfg_spec(cfg, nd)
    label = _label(dtype, cfg) + (" nd" if nd else "")
    return hopper.install(sp, template(dtype, cfg), inputs, (dtype,), label)


@dataclass(frozen=True)
class Plan:
    """One launch of the wgmma quantized GEMM; `run` makes the call."""

    launch: Launch
    m: int
    k: int
    reshape: bool  # x goes in as (M, K) and out comes back reshaped; else both as they are

    def run(self, x, w, scales, biases, poison=None):
        x2 = x.reshape(self.m, self.k) if self.reshape else x
        return self.launch(x2, w, scales, biases, init_value=poison)


_PLANS = Plans()


def _plan(x, w, scales, biases, group_size, bits, config) -> Plan:
    if x.dtype not in hopper.HALF:
        raise Unsupported(f"quantized_matmul dtype {x.dtype} on the Hopper path")
    k, n = x.shape[-1], w.shape[0]
    m = 1
    for s in x.shape[:-1]:
        m *= s
    if m == 0:
        raise Unsupported("quantized_matmul with M=0")
    cfg = config or choose_config(m, n, k, bits)
    if cfg.bits != bits:
        raise ValueError(f"{cfg} is for {cfg.bits}-bit weights, not {bits}")
    nd = x.ndim > 2 and prepare(x.dtype, cfg, True)  # x taken as it is
    if not nd and not prepare(x.dtype, cfg):
        raise Unsupported("quantized_matmul: MLX's kernel cache is not writable here")
    reshape = x.ndim != 2 and not nd
    launch = Launch(
        kernel=kernel(cfg_spec(cfg, nd)),
        template=template(x.dtype, cfg),
        grid=(cfg.blocks(m, n) * cfg.threads, 1, 1),
        group=(cfg.threads, 1, 1),
        out_shape=(m, n) if reshape else (*x.shape[:-1], n),
        out_dtype=x.dtype,
        out_view=(*x.shape[:-1], n) if reshape else None,
    )
    return Plan(launch, m, k, reshape)


def plan(x, w, scales, biases, group_size: int, bits: int, config=None) -> Plan:
    """The launch plan for these (already validated) arguments, built once per signature.
    qmm.py keeps it in its own plan table, so a decode step's call looks up one plan."""
    sig = (x.dtype, x.shape, w.shape, scales.shape, group_size, bits, config)
    return _PLANS.get(sig) or _PLANS.build(
        sig, _plan, x, w, scales, biases, group_size, bits, config
    )


def quantized_matmul(x, w, scales, biases, group_size: int, bits: int, *, config=None, poison=None):
    """x @ dequantize(w).T for already-validated affine arguments (qmm.py checks them)."""
    return plan(x, w, scales, biases, group_size, bits, config).run(x, w, scales, biases, poison)


# -- sibling projections in one launch -----------------------------------------------------------

# One launch over g quantized weights (q/k/v, gate/up) of one activation: block b computes
# tile b - (the tiles of the weights before its own) of its weight's product, with the code
# of that weight's own launch (qmm over the same configuration, every operand read as the
# rank-free entry reads it), so each output has its own launch's bits.
_GROUP_BODY = """
  int rows = 1;
  for (int i = 0; i + 1 < x_ndim; ++i) rows *= x_shape[i];
  const int K = x_shape[x_ndim - 1];
  const bih::Operand X = bih::operand(x, K, 1, rows);
  const int tm = (rows + RT - 1) / RT;
  int tile = blockIdx.x;
{pick}
  const bih::QuantOperand W{{reinterpret_cast<const unsigned char*>(w), n_words * 4ll,
      reinterpret_cast<const bih::u16*>(sc), reinterpret_cast<const bih::u16*>(bi),
      n_groups, n_groups, static_cast<long long>(n) * n_groups,
      static_cast<long long>(n) * n_groups, __ffs(K / n_groups) - 1}};
  bih::qmm<F16, BN, NWG, RT, KT, STAGES, BITS>(X, W, reinterpret_cast<bih::u16*>(o), rows, n, K,
      tile);
"""
GROUP_SIZES = (2, 3)


def _select(values: list[str]) -> str:
    """`i == 0 ? values[0] : i == 1 ? values[1] : ... values[-1]`."""
    out = values[-1]
    for i in range(len(values) - 2, -1, -1):
        out = f"i == {i} ? {values[i]} : {out}"
    return out


def _pick_source(g: int) -> str:
    """Kernel lines that find the member i of the block's tile (the tiles of the members before
    it counted off; the last takes the rest) and its operands, by selects rather than arrays
    indexed at run time (which would live in local memory)."""
    t = [f"t{i}" for i in range(g - 1)]
    before = ["0", *(" + ".join(t[:i]) for i in range(1, g))]
    member = " : ".join(f"tile < {' + '.join(t[: i + 1])} ? {i}" for i in range(g - 1))
    counts = ", ".join(f"t{i} = tm * ((w{i}_shape[0] + BN - 1) / BN)" for i in range(g - 1))
    lines = [
        f"  const int {counts};",
        f"  const int i = {member} : {g - 1};",
        f"  tile -= ({_select([f'({v})' for v in before])});",
    ]
    fields = (
        ("const void* w", "w{i}"),
        ("const void* sc", "scales{i}"),
        ("const void* bi", "biases{i}"),
        ("void* o", "out{i}"),
        ("const int n", "w{i}_shape[0]"),
        ("const int n_words", "w{i}_shape[1]"),
        ("const int n_groups", "scales{i}_shape[1]"),
    )
    lines += [f"  {decl} = {_select([fmt.format(i=i) for i in range(g)])};" for decl, fmt in fields]
    return "\n".join(lines)


@cache
def group_spec(g: int, shared_memory: int, narrow: bool = False) -> KernelSpec:
    """The grouped entry over g weights (GROUP_SIZES): inputs x (any rank, (..., K)) and w_i,
    scales_i, biases_i of each member; outputs out0 .. out{g-1} (..., N_i); every operand
    row-contiguous. narrow: the few-row kernel (its name ends in `_g{g}_n`)."""
    inputs = ["x"]
    for i in range(g):
        inputs += [f"w{i}", f"scales{i}", f"biases{i}"]
    name, source, files = _narrowed(
        f"bi_hopper_qmm_g{g}", _GROUP_BODY.format(pick=_pick_source(g)), narrow
    )
    return KernelSpec(
        name=name,
        inputs=tuple(inputs),
        outputs=tuple(f"out{i}" for i in range(g)),
        files=files,
        source=source,
        shared_memory=shared_memory,
        row_contiguous=True,
    )


@lru_cache(maxsize=256)
def prepare_group(dtype, cfg, g: int) -> bool:
    """Compile and install the grouped entry for g weights in configuration cfg (one of
    `group_configs`: the entry has no warp-specialised form, and launching that configuration's
    threads through the plain few-row body would compute other bits)."""
    if cfg.helpers:
        raise ValueError(f"the grouped quantized entry has no warp-specialised form: {cfg}")
    inputs = ((dtype, 3),) + ((mx.uint32, 2), (dtype, 2), (dtype, 2)) * g
    sp = group_spec(g, cfg.shared_memory, cfg.narrow)
    label = _label(dtype, cfg) + f" group of {g}"
    return hopper.install(sp, template(dtype, cfg), inputs, (dtype,) * g, label)


GROUP_ROWS = 64  # the decode configurations' rows: larger products run one launch a member


def group_config(m: int, widths: tuple[int, ...], bits: int):
    """The configuration of one launch over weights of these widths: the one a single product
    of their summed width would take (the number of blocks is the launch's), the plain
    few-row kernel's where that would be the warp-specialised one, which has no grouped entry.
    Speed only: every configuration gives each output the same bits."""
    return rows_config(m, sum(widths), bits, ws=False)


_GROUPS = Plans()


def _group_plan(x, members, group_size: int, bits: int):
    """A launch (a callable of x and the members' arrays) or None where one does not apply."""
    g, dt = len(members), x.dtype
    if g not in GROUP_SIZES or dt not in hopper.HALF or x.ndim < 2:
        return None
    m, k = hopper.rows(x.shape), x.shape[-1]
    if not 1 <= m <= GROUP_ROWS:
        return None
    for w, s, b in members:
        if w.dtype != mx.uint32 or w.ndim != 2 or s.dtype != dt or b is None or b.dtype != dt:
            return None
        if s.shape != b.shape or s.ndim != 2 or s.shape[0] != w.shape[0]:
            return None
        if w.shape[1] * 32 != k * bits or s.shape[1] * group_size != k:
            return None
    widths = tuple(w.shape[0] for w, _, _ in members)
    cfg = group_config(m, widths, bits)
    if not prepare_group(dt, cfg, g):
        return None
    blocks = sum(cfg.blocks(m, n) for n in widths)
    call, tmpl = bound(kernel(group_spec(g, cfg.shared_memory, cfg.narrow)), template(dt, cfg))
    lead = tuple(x.shape[:-1])
    # Everything but the arrays is fixed by the signature: built once, passed on every call.
    fixed = dict(
        template=tmpl,
        grid=(blocks * cfg.threads, 1, 1),
        threadgroup=(cfg.threads, 1, 1),
        output_shapes=[(*lead, n) for n in widths],
        output_dtypes=[dt] * g,
    )

    def launch(x, members):
        return call(inputs=[x, *(a for mem in members for a in mem)], **fixed)

    return launch


def grouped_quantized_matmul(x, members, group_size: int, bits: int):
    """[x @ dequantize(w, s, b).T for (w, s, b) in members] in one launch, each output the bits
    of its own `quantized_matmul` (the same kernel code over the same tile, and every
    configuration gives the same bits); None where that launch does not apply (more than
    GROUP_ROWS rows, mixed shapes or dtypes, a member without biases): the caller then
    launches them one by one. Arguments already validated as affine (qmm.py)."""
    p = group_launch(x, members, group_size, bits)
    return None if p is None else p(x, members)


def group_launch(x, members, group_size: int, bits: int, build: bool = True):
    """grouped_quantized_matmul's launch for arguments of these shapes, a callable of x and
    the members' arrays, or None where one launch does not apply; build=False: None also where
    no call has built it yet."""
    sig = (x.dtype, x.shape, group_size, bits, *[(w.shape, s.dtype) for w, s, _ in members])
    p = _GROUPS.get(sig, False)
    if p is False:
        p = _GROUPS.build(sig, _group_plan, x, members, group_size, bits) if build else None
    return p
