"""Batch-invariant scaled dot-product attention on MLX's CUDA backend.

mx.fast.scaled_dot_product_attention's semantics (q [B, Hq, Tq, D], k/v [B, Hkv, Tk, D], GQA,
mask None / "causal" (lower-right aligned) / bool / additive, broadcast to [B, Hq, Tq, Tk],
sinks [Hq]) computed by kernels/cuda/attention*.cu with one algorithm for decode, chunked
prefill and full prefill: each row's keys are reduced in fixed 64-key blocks and 512-key
splits (bi_rl._split) counted from the row's first valid key, so a row's bits do not depend
on the batch, on the other query rows, on left padding, on cache capacity or on keys
appended after it.
`choose_config` picks warps per block and sequential vs split mode (splits on separate blocks,
folded in order by a combine kernel) for speed; all choices give the same bits. A row with no
valid key gives zeros. bf16/f16 run on the tensor cores; float32 runs a one-warp-per-row fmaf
kernel with the same blocks (no TF32, no bf16 rounding). Head dims 64, 80, 96, 128 and 256
(at 256 the half kernel keeps the query in shared memory and computes the output in two
column halves on separate blocks; the reduction order per output is unchanged).

Two keyword arguments beyond MLX's, for sliding-window layers and rotating caches:

  window=W (int > 0): query row i sits at key position p = i + Tk - Tq (the lower-right
    alignment of "causal") and sees only keys max(0, p - W + 1) .. p, intersected with the
    mask (any form; None means just the window). Keys outside every row's window are never
    read. The result has the bits of the same call with the window spelled as a bool mask
    (bi_rl.backends.composed.window_mask): both start the row's blocks at its first valid key.
    A bool mask noted with the window folded into it (bi_rl._mask_window: the windowed KV
    caches note theirs) is taken with that window, so the kernels start a row's search for
    its first key at the window and plan splits over the keys it can see, with the bits of
    the mask alone.
  key_start (int32 [B]): ring storage. Batch row b's keys sit in a ring of capacity Tk:
    logical key j (position order: j = 0 the oldest) is stored at index
    (key_start[b] + j) mod Tk, for any int32 key_start (reduced mod Tk). Everything else
    speaks of logical keys: the mask's last axis, causality and the window index logical
    positions, and keys are reduced in logical order. So a rotating cache, after any number
    of wrap-arounds, gives the bits of the same keys stored in position order, and of a
    longer cache or a full-sequence pass with the window as a mask.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache, lru_cache

import mlx.core as mx

from bi_rl import _mask_window as mask_window
from bi_rl._split import KEYS_PER_SPLIT as KEYS_PER_SPLIT
from bi_rl._split import split_keys
from bi_rl.backends.base import Unsupported
from bi_rl.backends.composed import attention_window_args
from bi_rl.backends.cuda import hopper_attention
from bi_rl.backends.cuda._kernels import (
    KernelSpec,
    Launch,
    Plans,
    attn_shape_source,
    cdiv,
    float_template,
    kernel,
    split_defines,
)

FILES = ("cuda/common.cuh", "cuda/attention_rows.cuh", "cuda/attention_common.cuh")
HEAD_DIMS = (64, 80, 96, 128, 256)
KEYS_PER_BLOCK = 64
# Keys (counted in whole splits, the same at every split size) from which splitting a row's
# keys over blocks pays
SPLIT_FROM_KEYS = 64 * 256
SPLIT_BELOW_WARPS = 528  # ... and only where sequential mode would leave the GPU this empty
# Split mode: the keys one block reduces go 256, 1024, 4096 (BLOCK_KEYS: that many keys'
# worth of consecutive splits a block, at least one; 1, 2 and 8 splits of the default 512
# keys, the values configs() tests) while at least SPLIT_BLOCKS blocks remain, so a block
# streams many key tiles through its pipeline instead of filling and draining it for one
# split, and the grid still fills the GPU. The steps are counted in keys, so every split size
# (bi_rl._split) gets the same blocks of keys: 1, 4 and 16 splits of 256, 1 and 4 of 1024.
SPLIT_BLOCKS = 2048
BLOCK_KEYS = (256, 1024, 4096)
# Small grids (few rows decoding over long keys: at most SMALL_GRID_KEYS keys in all, counted
# in whole splits) take the longest run of splits a block at once where that still leaves
# SMALL_GRID_BLOCKS blocks: a block's fill and drain of its pipeline, per split, costs more
# there than the blocks it leaves idle. Below that many blocks one block's serial walk over
# its keys sets the time.
SMALL_GRID_KEYS = 4096 * 256
SMALL_GRID_BLOCKS = 48


def splits_per_block_steps(keys_per_split: int = KEYS_PER_SPLIT) -> tuple[int, ...]:
    """The splits a block may take in split mode at this split size, ascending: BLOCK_KEYS in
    whole splits (at least one)."""
    return tuple(sorted({max(1, keys // keys_per_split) for keys in BLOCK_KEYS}))


MAX_SHARED = 232448  # dynamic shared memory one block may use on sm_90 (227 KB)

NO_MASK, CAUSAL, BOOL_MASK, ADDITIVE = 0, 1, 2, 3


def q_in_smem(d: int) -> bool:
    """Whether the half kernel keeps the query fragments in shared memory (ATT_Q_IN_SMEM)."""
    return d > 128


def value_cols(d: int) -> int:
    """Output columns one block computes (ATT_VALUE_COLS): d, or d / 2 above 128."""
    return d // 2 if d > 128 else d


@dataclass(frozen=True)
class AttnConfig:
    warps: int  # 16-row query tiles per block, sharing K/V tiles
    stages: int  # K/V pipeline depth
    split: bool  # splits as partials over blocks + combine kernel
    splits_per_block: int = 1  # split mode: consecutive splits one block computes

    def shared_memory(self, d: int) -> int:
        """Bytes of the half kernel's layout: K and V stages (V: this block's columns), the
        query fragments (above 128), the fold buffer of sequential mode (split mode has none:
        one split a block) and the row ranges."""
        dv = value_cols(d)
        kv = self.stages * KEYS_PER_BLOCK * ((d + 8) + (dv + 8)) * 2
        q = (d // 16) * 32 * 16 * self.warps if q_in_smem(d) else 0
        fold = 0 if self.split else (dv // 2) * 32 * self.warps * 4
        return kv + q + fold + 2 * 16 * self.warps * 4


def choose_config(
    b: int, hkv: int, rows_per: int, tk: int, d: int, keys_per_split: int = KEYS_PER_SPLIT
) -> AttnConfig:
    """Warps per block, pipeline depth and split vs sequential: speed only, never bits.

    tk: the most keys one row can see (the window where it is shorter than the keys). A
    2-stage K/V pipeline (less shared memory, more blocks per SM). One warp walks all of
    a row's keys unless its splits hold at least SPLIT_FROM_KEYS keys and sequential mode would
    leave the GPU nearly empty: a second launch and the partials cost more than the extra
    parallelism below that. In split mode a block takes several consecutive splits where
    that still leaves SPLIT_BLOCKS blocks, or the most splits where the whole grid is small
    (SMALL_GRID_KEYS) and keeps SMALL_GRID_BLOCKS blocks. Thresholds from timing on the
    H200 (docs/cuda-design.md).
    """
    warps = 1 if rows_per <= 16 else (2 if rows_per <= 32 else 4)
    groups = b * hkv * cdiv(rows_per, 16 * warps)
    nsplit = cdiv(tk, keys_per_split)
    split = nsplit * keys_per_split >= SPLIT_FROM_KEYS and groups * warps < SPLIT_BELOW_WARPS
    steps = splits_per_block_steps(keys_per_split)
    spb = 1
    if split and groups * nsplit * keys_per_split <= SMALL_GRID_KEYS:
        if groups * cdiv(nsplit, steps[-1]) >= SMALL_GRID_BLOCKS:
            spb = steps[-1]
    elif split:
        for more in steps[1:]:
            if groups * cdiv(nsplit, more) < SPLIT_BLOCKS:
                break
            spb = more
    return AttnConfig(warps, 2, split, spb)


def configs(keys_per_split: int | None = None) -> list[AttnConfig]:
    """Configurations tests force against each other (the bits must not move), with every
    number of splits a block `choose_config` can pick at this split size (default: the
    process's, bi_rl._split.split_keys())."""
    steps = splits_per_block_steps(keys_per_split or split_keys())
    middle, most = steps[len(steps) // 2], steps[-1]
    return [
        AttnConfig(1, 2, False),
        AttnConfig(1, 3, False),
        AttnConfig(1, 2, True),
        AttnConfig(1, 2, True, middle),
        AttnConfig(2, 2, False),
        AttnConfig(4, 2, False),
        AttnConfig(4, 3, True),
        AttnConfig(2, 3, True, most),
    ]


def _inputs(has_mask: bool, has_sinks: bool, ring: bool) -> list[str]:
    extra = [n for n, on in (("mask", has_mask), ("sinks", has_sinks), ("key_start", ring)) if on]
    return ["q", "k", "v", *extra]


def _args(has_mask: bool, has_sinks: bool, ring: bool) -> str:
    """The kernel function's optional pointer arguments (nullptr where absent)."""
    return ", ".join(
        name if on else "nullptr"
        for name, on in (("mask", has_mask), ("sinks", has_sinks), ("key_start", ring))
    )


def _suffix(has_mask: bool, has_sinks: bool, ring: bool) -> str:
    return f"{'_m' if has_mask else ''}{'_s' if has_sinks else ''}{'_r' if ring else ''}"


@cache
def kernel_spec(
    has_mask: bool,
    has_sinks: bool,
    split: bool,
    shared_memory: int,
    ring: bool = False,
    keys_per_split: int = KEYS_PER_SPLIT,
) -> KernelSpec:
    """The half-precision kernel; split mode writes per-split partials for `combine_spec`.
    ring: a key_start input (ring storage); keys_per_split: keys per split
    (bi_rl._split.split_keys)."""
    inputs = _inputs(has_mask, has_sinks, ring)
    body = attn_shape_source("bi", has_mask)
    outs = "nullptr, part" if split else "out, nullptr"
    body += (
        f"  bi::attention_fwd<T, D, NW, STAGES, MASK, SINKS, SPLIT, {str(ring).lower()}, SPB>"
        f"(q, k, v, "
        f"{_args(has_mask, has_sinks, ring)}, S, "
        f"bi::bits_to_float(SCALE_BITS, SCALE_NEG), {outs});\n"
    )
    name = f"bi_attn{_suffix(has_mask, has_sinks, ring)}{'_split' if split else ''}"
    name += "" if keys_per_split == KEYS_PER_SPLIT else f"_k{keys_per_split}"
    outputs = ("part",) if split else ("out",)
    files = (*FILES, "cuda/attention.cu")
    defines = split_defines(keys_per_split)
    return KernelSpec(name, tuple(inputs), outputs, files, body, shared_memory, defines=defines)


def combine_warps(d: int) -> int:
    """Warps the combine kernel gives a row: one for each 32 of its values (its
    combine_warps)."""
    return cdiv(d, 32)


@cache
def combine_spec(has_sinks: bool) -> KernelSpec:
    """The kernel that folds split mode's partials in order."""
    body = (
        "  const int rows = part_shape[0], nsplit = part_shape[1];\n"
        "  bi::attention_combine<T, D, SINKS>(part, rows, nsplit, q_shape[1], q_shape[2], "
        f"{'sinks' if has_sinks else 'nullptr'}, out);\n"
    )
    inputs = ("part", "q", "sinks") if has_sinks else ("part", "q")
    return KernelSpec(
        f"bi_attn_combine{'_s' if has_sinks else ''}",
        inputs,
        ("out",),
        (*FILES, "cuda/attention_combine.cu"),
        body,
    )


@cache
def f32_spec(has_mask: bool, has_sinks: bool, ring: bool = False) -> KernelSpec:
    """The float32 kernel (one warp per row, fmaf only)."""
    inputs = _inputs(has_mask, has_sinks, ring)
    body = attn_shape_source("bi", has_mask)
    body += (
        f"  bi::attention_f32<D, MASK, SINKS, {str(ring).lower()}>(q, k, v, "
        f"{_args(has_mask, has_sinks, ring)}, S, "
        "bi::bits_to_float(SCALE_BITS, SCALE_NEG), out);\n"
    )
    name = f"bi_attn_f32{_suffix(has_mask, has_sinks, ring)}"
    return KernelSpec(name, tuple(inputs), ("out",), (*FILES, "cuda/attention_f32.cu"), body)


@lru_cache(maxsize=1024)
def f32_template_args(d: int, mask_kind: int, sinks: bool, scale: float, window: int = 0):
    return [
        ("D", d),
        ("MASK", mask_kind),
        ("SINKS", sinks),
        ("WINDOW", window),
        *float_template("SCALE", scale),
    ]


@lru_cache(maxsize=1024)
def template_args(
    dtype, d: int, cfg: AttnConfig, mask_kind: int, sinks: bool, scale: float, window: int = 0
):
    return [
        ("T", dtype),
        ("D", d),
        ("NW", cfg.warps),
        ("STAGES", cfg.stages),
        ("MASK", mask_kind),
        ("SINKS", sinks),
        ("SPLIT", cfg.split),
        ("SPB", cfg.splits_per_block if cfg.split else 1),
        ("WINDOW", window),
        *float_template("SCALE", scale),
    ]


def combine_template_args(dtype, d: int, sinks: bool):
    return [("T", dtype), ("D", d), ("SINKS", sinks)]


def _mask_4d(mask):
    """An array mask as the 4-D view the kernels read ([B, H, Tq, Tk], broadcastable)."""
    return mask if mask.ndim == 4 else mask.reshape((1,) * (4 - mask.ndim) + tuple(mask.shape))


def _check_mask(mask, shape: tuple[int, int, int, int]) -> None:
    if mask.ndim > 4:
        raise ValueError(f"attention mask with shape {tuple(mask.shape)} has more than 4 dims")
    for have, want in zip(_mask_4d(mask).shape, shape, strict=True):
        if have not in (1, want):
            raise ValueError(
                f"attention mask with shape {tuple(mask.shape)} does not broadcast to {shape}"
            )


_PLANS = Plans()


def _plan(
    q, k, v, scale, mask, sinks, config, window, ring, keys: int
) -> tuple[Launch, Launch | None]:
    """The forward launch, and in split mode the combine launch after it. window: an int
    > 0 or None (checked); ring: whether a key_start input follows; keys: keys a split."""
    for name, x in (("q", q), ("k", k), ("v", v)):
        if x.ndim != 4:
            raise ValueError(f"attention {name} must be 4-D [B, H, T, D], got {tuple(x.shape)}")
    dt = q.dtype
    if dt not in (mx.float16, mx.bfloat16, mx.float32):
        raise Unsupported(f"scaled_dot_product_attention dtype {dt}")
    if k.dtype != dt or v.dtype != dt:
        raise Unsupported(f"scaled_dot_product_attention mixed dtypes {dt}, {k.dtype}, {v.dtype}")
    b, hq, tq, d = q.shape
    _, hkv, tk, dk = k.shape
    if d not in HEAD_DIMS or dk != d or v.shape[-1] != d:
        raise Unsupported(
            f"scaled_dot_product_attention head dim {d} (k {dk}, v {v.shape[-1]}); "
            f"supported: {HEAD_DIMS}"
        )
    if k.shape[0] != b or v.shape[0] != b or v.shape[1] != hkv or v.shape[2] != tk:
        raise ValueError(f"attention shapes q {q.shape}, k {k.shape}, v {v.shape} do not agree")
    if hkv == 0 or hq % hkv != 0:
        raise ValueError(f"attention heads: {hq} query heads, {hkv} kv heads")
    if b * hq * tq == 0:
        raise Unsupported("scaled_dot_product_attention with no query rows")
    if tk == 0:
        raise Unsupported("scaled_dot_product_attention with no keys")
    if mask is None:
        kind = NO_MASK
    elif isinstance(mask, str):
        if mask != "causal":
            raise ValueError(f"attention mask {mask!r}: only 'causal' is a string mask")
        kind = CAUSAL
    else:
        _check_mask(mask, (b, hq, tq, tk))
        kind = BOOL_MASK if mask.dtype == mx.bool_ else ADDITIVE
    if sinks is not None and (sinks.ndim != 1 or sinks.shape[0] != hq):
        raise ValueError(f"attention sinks must have shape ({hq},), got {tuple(sinks.shape)}")

    has_mask, has_sinks = kind >= BOOL_MASK, sinks is not None
    win = window or 0
    out_shape = (b, hq, tq, d)
    rows = b * hq * tq
    if dt == mx.float32:
        fwd = Launch(
            kernel=kernel(f32_spec(has_mask, has_sinks, ring)),
            template=f32_template_args(d, kind, has_sinks, float(scale), win),
            grid=(cdiv(rows, 4) * 128, 1, 1),
            group=(128, 1, 1),
            out_shape=out_shape,
            out_dtype=dt,
        )
        return fwd, None
    rows_per = tq * (hq // hkv)
    seen = min(tk, window) if window else tk  # the most keys one row can see
    cfg = config or choose_config(b, hkv, rows_per, seen, d, keys)
    blocks = b * hkv * cdiv(rows_per, 16 * cfg.warps)
    spb = cfg.splits_per_block if cfg.split else 1
    split_blocks = cdiv(cdiv(seen, keys), spb)  # partial slots: split_blocks * spb
    threads = 32 * cfg.warps
    sp = kernel_spec(has_mask, has_sinks, cfg.split, cfg.shared_memory(d), ring, keys)
    fwd = Launch(
        kernel=kernel(sp),
        template=template_args(dt, d, cfg, kind, has_sinks, float(scale), win),
        grid=(blocks * threads, split_blocks if cfg.split else 1, d // value_cols(d)),
        group=(threads, 1, 1),
        out_shape=(rows, split_blocks * spb, d + 2) if cfg.split else out_shape,
        out_dtype=mx.float32 if cfg.split else dt,
    )
    if not cfg.split:
        return fwd, None
    combine = Launch(
        kernel=kernel(combine_spec(has_sinks)),
        template=combine_template_args(dt, d, has_sinks),
        grid=(rows * 32 * combine_warps(d), 1, 1),
        group=(128, 1, 1),
        out_shape=out_shape,
        out_dtype=dt,
    )
    return fwd, combine


def _planned(q, k, v, scale, mask, sinks, config, window, key_start):
    """_plan's launches, and where the wgmma kernel (hopper_attention.py) serves the call when
    that kernel is on, the keys a split both kernels take (0 where it does not serve it):
    `hopper_attention.applies` reads the arguments' shapes, dtypes and options, all in the
    plan's signature, so it is decided once with the plan. A call it does not serve (a decode
    step's few query rows) then skips the per-call lookup of whether the kernel is on. The
    split size is read once for the plan, so a plan's two kernels never take two sizes.
    window and key_start: checked (attention_window_args)."""
    keys = split_keys()
    ring = key_start is not None
    fwd, combine = _plan(q, k, v, scale, mask, sinks, config, window, ring, keys)
    mdtype = None
    if mask is not None and not isinstance(mask, str):  # the dtype the kernels read it in
        mdtype = mask.dtype if mask.dtype in (mx.bool_, q.dtype) else q.dtype
    serves = hopper_attention.applies(q, k, sinks, key_start, mdtype, window)
    return fwd, combine, keys if serves else 0


def _hopper(q, k, v, scale, mask, inputs, keys: int, window: int):
    """The wgmma kernel's output for a call it serves (the plan says so), or None where MLX's
    kernel cache cannot be written. inputs: q, k, v and the 4-D mask as the kernels read it;
    keys: keys a split, the plan's; window: the call's (0: none; `applies` takes one only
    where it leaves out no key)."""
    mask_arr = inputs[3] if len(inputs) > 3 else None
    if mask is None:
        kind = NO_MASK
    elif isinstance(mask, str):
        kind = CAUSAL
    else:
        kind = BOOL_MASK if mask_arr.dtype == mx.bool_ else ADDITIVE
    return hopper_attention.launch(q, k, v, scale, mask_arr, kind, window, keys_per_split=keys)


def scaled_dot_product_attention(
    q,
    k,
    v,
    scale,
    mask=None,
    sinks=None,
    *,
    window=None,
    key_start=None,
    config=None,
    poison=None,
):
    """mx.fast.scaled_dot_product_attention(q, k, v, scale=scale, mask=mask, sinks=sinks),
    with a sliding `window` and ring storage (`key_start`) as the module docstring defines.

    config forces a configuration and poison pre-fills the output (tests). The plan for an
    argument signature is built once; a call then only assembles inputs and launches.
    """
    if window is None and key_start is None and isinstance(mask, mx.array):
        # a window folded into the mask by a windowed KV cache: telling the kernels spares
        # them the keys before it (the same keys, so the same bits)
        window = mask_window.window_of(mask, q.shape[2], k.shape[2])
    msig = mask if mask is None or isinstance(mask, str) else (mask.dtype, mask.shape)
    ssig = None if sinks is None else (sinks.dtype, sinks.shape)
    ksig = None if key_start is None else (key_start.dtype, key_start.shape)
    sig = (q.dtype, q.shape, k.dtype, k.shape, v.dtype, v.shape, msig, ssig, scale, config)
    if window is not None or key_start is not None:
        sig += (window, ksig)
    plan = _PLANS.get(sig)
    if plan is None:
        window, key_start = attention_window_args(window, key_start, q.shape[0])
        plan = _PLANS.build(sig, _planned, q, k, v, scale, mask, sinks, config, window, key_start)
    elif key_start is not None and key_start.dtype != mx.int32:
        key_start = key_start.astype(mx.int32)
    fwd, combine, wgmma_keys = plan
    dt = q.dtype
    inputs = [q, k, v]
    if mask is not None and not isinstance(mask, str):
        m4 = _mask_4d(mask)
        inputs.append(m4 if m4.dtype in (mx.bool_, dt) else m4.astype(dt))
    if wgmma_keys and config is None and poison is None and hopper_attention.enabled():
        out = _hopper(q, k, v, scale, mask, inputs, wgmma_keys, window or 0)
        if out is not None:
            return out
    extra = [] if sinks is None else [sinks if sinks.dtype == dt else sinks.astype(dt)]
    if key_start is not None:
        extra.append(key_start)
    if combine is None:
        return fwd(*inputs, *extra, init_value=poison)
    sink = extra[:1] if sinks is not None else []
    return combine(fwd(*inputs, *extra), q, *sink, init_value=poison)
