"""Prefill attention on Hopper tensor cores (wgmma): kernels/cuda/hopper/attention.cu.

The kernel computes what attention.py's `mma.sync` kernel computes, element for element, with
the score and value products as `wgmma` chains over the same k16 steps; its opening comment
says why a row's bits cannot depend on the batch. Whether those chains give the same fp32
bits as `mma.sync`'s is a property of the hardware that `tools/mma_equiv.cu` measures, and
the GPU tests compare the two kernels bit for bit: mixing the two kernels in one computation
(decode on one, rescoring on the other) keeps its guarantee only because they agree. On a
Hopper GPU the path serves every call in its scope; BI_RL_HOPPER_ATTENTION=0 keeps the
`mma.sync` kernel (the same bits, slower on long prompts). BI_RL_HOPPER_PINGPONG=1 runs its
two-warpgroup blocks without an array mask in the ping-pong schedule (`pingpong`: the two
warpgroups take turns at the tensor cores; the same bits), off by default until it is timed.

Scope: bf16 / f16, head dims 64 and 128, masks none / causal / bool / additive, keys in
position order, no sinks, no sliding window shorter than the keys (`applies`); the whole row
in one block (no split partials), so it serves rows with many query positions (prefill,
rescoring). Compiled by bi-rl for sm_90a and placed in MLX's kernel cache as the Hopper GEMMs
are (hopper.py).
"""

from __future__ import annotations

import os
from functools import cache, lru_cache

import mlx.core as mx

from bi_rl._split import KEYS_PER_SPLIT, split_keys
from bi_rl.backends.cuda import hopper
from bi_rl.backends.cuda._kernels import (
    MAPS_DTYPE,
    KernelSpec,
    Launch,
    attn_shape_source,
    cdiv,
    float_template,
    kernel,
    split_defines,
    tma_maps_words,
)

FILES = (
    "cuda/hopper/common.cuh",
    "cuda/hopper/tma.cuh",
    "cuda/hopper/wgmma_ops.cuh",
    "cuda/hopper/wgmma_rs.cuh",
    "cuda/attention_rows.cuh",
    "cuda/hopper/attention.cu",
)
ENV = "BI_RL_HOPPER_ATTENTION"  # "0": the mma.sync kernel for every call
HEAD_DIMS = (64, 128)
# K/V stages: the block whose V is read, the next one whose K is (its scores run during this
# block's softmax), and one loading
STAGES = 3
# The ping-pong schedule refills a stage only once both warpgroups are done with it, at the end
# of a step: one stage more keeps the copy a step ahead of its scores.
PP_STAGES = 4
PP_ENV = "BI_RL_HOPPER_PINGPONG"  # "1": two-warpgroup blocks without an array mask ping-pong
ROWS = 64  # query rows (query position, head of the kv group) per warpgroup
TILE = 64 * 128  # bytes of one 64-row x 64-column swizzled tile
MIN_ROWS = 64  # below this many rows per (batch, kv head) the mma.sync kernel serves


def shared_memory(d: int, nwg: int, stages: int = STAGES, tma: bool = False) -> int:
    """attention_wg_smem<D, STAGES, NWG, TMA>() of the kernel: alignment slack, Q of each
    warpgroup, K and V stages, the row ranges, the fold buffer, the pass's key range, two
    mbarriers a stage, and with tma the K and V tensor maps and 128 bytes to align them."""
    fold = (d // 2) * 128 * nwg * 4
    tail = 16 + 16 * stages + (384 if tma else 0)
    return 1024 + (d // 64) * TILE * (nwg + 2 * stages) + 2 * 64 * nwg * 4 + fold + tail


def pingpong_enabled() -> bool:
    """BI_RL_HOPPER_PINGPONG: "1" turns the ping-pong schedule on where it applies
    (`pingpong`), "0" or unset leaves it off; anything else is refused."""
    return hopper.switch(PP_ENV, False)


def pingpong(nwg: int, mask_kind: int) -> bool:
    """Whether a launch of nwg warpgroups a block with this mask kind runs the ping-pong
    schedule: two warpgroups, no array mask (with one the next block's scores wait for the
    mask reads, so there is no softmax to overlap), and the setting on. Speed only: a row's
    operations and their order are the same in either schedule."""
    return nwg == 2 and mask_kind < 2 and pingpong_enabled()


def tma_copies(pp: bool) -> bool:
    """Whether a launch copies its K/V blocks through the tensor memory accelerator: in the
    ping-pong schedule (whose mbarriers hand its stages over), where BI_RL_HOPPER_TMA=1 (the
    setting the Hopper GEMM reads too). Speed only: a stage's bytes are the same."""
    return pp and hopper.tma_enabled()


def warpgroups(rows: int, d: int, groups: int = 1) -> int:
    """Warpgroups per block for `rows` rows per (batch, kv head) at head dim d, over `groups`
    (batch, kv head) pairs: at 128, two (128 rows sharing each K/V stage, eight warps per
    multiprocessor) once there are rows for them; at 64, one (there two were the slower on the
    H200, at 2048 and 8192 tokens). With the GEMM's block-shape rule on (hopper.fill_enabled:
    the default; BI_RL_HOPPER_FILL=0 turns it off), two only where their blocks reach
    hopper.fill_need(), as the GEMM's do: a short sequence (600 tokens of 16 query heads over
    8 KV heads make 80 two-warpgroup blocks) leaves fewer idle as twice as many one-warpgroup
    blocks. Speed only: a row's arithmetic is the same in either."""
    if d != 128 or rows < 2 * ROWS:
        return 1
    if hopper.fill_enabled() and groups * cdiv(rows, 2 * ROWS) < hopper.fill_need():
        return 1
    return 2


@cache
def spec(
    has_mask: bool,
    d: int,
    nwg: int,
    keys_per_split: int = KEYS_PER_SPLIT,
    pp: bool = False,
    tma: bool = False,
) -> KernelSpec:
    """The kernel with or without an array mask, for head dim d and nwg warpgroups (its
    shared memory), with keys_per_split keys a split (bi_rl._split.split_keys), in the
    ping-pong schedule with pp, its K/V blocks copied by TMA with tma (pp only; a second
    output, `maps`: MAPS_DTYPE, tma_maps_words)."""
    if tma and not pp:
        raise ValueError("TMA copies run in the ping-pong schedule only (pp=True)")
    body = attn_shape_source("bih", has_mask)
    body += (
        f"  bih::attention_wg<F16, D, MASK, STAGES, NWG, PP{', true' if tma else ''}>("
        "reinterpret_cast<const bih::u16*>(q), reinterpret_cast<const bih::u16*>(k), "
        f"reinterpret_cast<const bih::u16*>(v), {'mask' if has_mask else 'nullptr'}, S, "
        "bih::f32_from_bits(SCALE_BITS, SCALE_NEG), reinterpret_cast<bih::u16*>(out)"
        f"{', reinterpret_cast<unsigned char*>(maps)' if tma else ''});\n"
    )
    inputs = ("q", "k", "v", "mask") if has_mask else ("q", "k", "v")
    name = f"bi_hattn{'_m' if has_mask else ''}"
    name += "" if keys_per_split == KEYS_PER_SPLIT else f"_k{keys_per_split}"
    name += "_pp" if pp else ""
    name += "_t" if tma else ""
    smem = shared_memory(d, nwg, PP_STAGES if pp else STAGES, tma)
    defines = split_defines(keys_per_split)
    outputs = ("out", "maps") if tma else ("out",)
    return KernelSpec(name, inputs, outputs, FILES, body, smem, defines=defines)


@lru_cache(maxsize=1024)
def template(
    dtype, d: int, mask_kind: int, scale: float, window: int, nwg: int, pp: bool = False
) -> list:
    return [
        ("F16", dtype == mx.float16),
        ("D", d),
        ("MASK", mask_kind),
        ("STAGES", PP_STAGES if pp else STAGES),
        ("NWG", nwg),
        ("PP", pp),
        ("WINDOW", window),
        *float_template("SCALE", scale),
    ]


def enabled() -> bool:
    """On a GPU that runs the Hopper kernels, unless BI_RL_HOPPER_ATTENTION=0."""
    return os.environ.get(ENV, "") != "0" and hopper.available()


def applies(q, k, sinks, key_start, mask_dtype, window=None) -> bool:
    """Whether this kernel serves a call: its scope, and enough query rows per (batch, kv
    head) to fill a block. Not with a sliding window that leaves out keys (more keys than
    the window): each row then has a first key of its own, and the kernel computes rows whose
    first keys differ in passes of their own, which is slower than the mma.sync kernel there
    (the kernel itself supports the window). A window as long as the keys only bounds each
    row at its query, as causality does."""
    b, hq, tq, d = q.shape
    return (
        (not window or k.shape[2] <= window)
        and q.dtype in hopper.HALF
        and d in HEAD_DIMS
        and sinks is None
        and key_start is None
        and (mask_dtype is None or mask_dtype in (mx.bool_, q.dtype))
        and tq * (hq // k.shape[1]) >= MIN_ROWS
    )


@lru_cache(maxsize=1024)
def prepare(
    dtype,
    d,
    mask_kind,
    scale,
    window,
    nwg,
    mask_dtype,
    ndims,
    keys_per_split: int = KEYS_PER_SPLIT,
    pp: bool = False,
    tma: bool = False,
) -> bool:
    """Compile the instantiation for sm_90a and place it in MLX's kernel cache (hopper.install).
    ndims: the ranks of the inputs as the launch passes them."""
    has_mask = mask_dtype is not None
    sp = spec(has_mask, d, nwg, keys_per_split, pp, tma)
    tmpl = template(dtype, d, mask_kind, scale, window, nwg, pp)
    ins = [(dtype, n) for n in ndims[:3]] + ([(mask_dtype, ndims[3])] if has_mask else [])
    name = "f16" if dtype == mx.float16 else "bf16"
    label = f"attention {name} d{d} mask{mask_kind}{f' w{window}' if window else ''} x{nwg}"
    label += (" ping-pong" if pp else "") + (" tma" if tma else "")
    outs = (dtype, MAPS_DTYPE) if tma else (dtype,)
    return hopper.install(sp, tmpl, tuple(ins), outs, label)


def launch(q, k, v, scale: float, mask, mask_kind: int, window: int, *rest, **options):
    """out = attention(q, k, v) through the wgmma kernel; mask already 4-D (or None) and of
    bool or q's dtype; the rest as `plan` takes them (nwg, keys_per_split, pp, tma: forced by
    tests, decided by the dispatcher where left out). Returns None where MLX's kernel cache
    cannot be written (the caller then runs the mma.sync kernel)."""
    fwd = plan(q, k, scale, mask, mask_kind, window, *rest, **options)
    if fwd is None:
        return None
    inputs = [q, k, v] if mask is None else [q, k, v, mask]
    return fwd(*inputs)


def plan(
    q,
    k,
    scale: float,
    mask,
    mask_kind: int,
    window: int,
    nwg: int | None = None,
    keys_per_split: int | None = None,
    pp: bool | None = None,
    tma: bool | None = None,
) -> Launch | None:
    """launch()'s Launch for these arguments, its kernel compiled and installed (None where
    MLX's kernel cache cannot be written). nwg forces the warpgroups per block (tests);
    keys_per_split: keys a split (the mma.sync kernel's, so the two agree), by default the
    process's (split_keys), as the mma.sync kernel reads it: a caller that leaves it out (the
    GPU tests) cannot run the two kernels at different split sizes. pp forces the ping-pong
    schedule on or off (tests; it needs two warpgroups and no array mask), by default
    `pingpong` decides; tma forces the K/V copies through TMA on or off (pp only), by default
    `tma_copies` decides."""
    if keys_per_split is None:
        keys_per_split = split_keys()
    b, hq, tq, d = q.shape
    hkv = k.shape[1]
    rows = tq * (hq // hkv)
    nwg = nwg or warpgroups(rows, d, b * hkv)
    pp = pingpong(nwg, mask_kind) if pp is None else pp
    tma = tma_copies(pp) if tma is None else tma
    mask_dtype = None if mask is None else mask.dtype
    ndims = (4, 4, 4, 4) if mask is not None else (4, 4, 4)
    scale = float(scale)
    args = (q.dtype, d, mask_kind, scale, window, nwg, mask_dtype, ndims, keys_per_split, pp)
    if not prepare(*args, tma):
        return None
    blocks = b * hkv * cdiv(rows, ROWS * nwg)
    return Launch(
        kernel=kernel(spec(mask is not None, d, nwg, keys_per_split, pp, tma)),
        template=template(q.dtype, d, mask_kind, scale, window, nwg, pp),
        grid=(blocks * 128 * nwg, 1, 1),
        group=(128 * nwg, 1, 1),
        out_shape=(b, hq, tq, d),
        out_dtype=q.dtype,
        scratch=((tma_maps_words(blocks),), MAPS_DTYPE) if tma else None,
    )
