"""Batch-invariant GEMM on MLX's CUDA backend: linear, grouped_linear, matmul and addmm.

out[m, n] = alpha * sum_k a[m, k] b[k, n] + beta * c[m, n], computed by kernels/cuda/gemm_*.cu
with a reduction sequence that depends on K alone: row m of the output is the same bits
whatever M is, whatever other rows are computed with it and whichever tile configuration
`choose_config` picks for the problem size (every config in `configs()` is tested bitwise
against every other). bf16/f16 use m16n8k16 tensor-core MMAs with fp32 accumulation; float32
uses plain fmaf (no TF32). Weights are read in place through their strides (the nn.Linear
layout W (N, K), or a b = W.T view), and the bias or c is added once in fp32 and rounded once.

On Hopper (sm_90) bf16/f16 run hopper.py's wgmma kernels instead, at every M: bits need to
agree within one kind of device, and each family keeps its own K-only order for every M.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache, lru_cache

import mlx.core as mx

from bi_rl.backends.cuda import hopper
from bi_rl.backends.cuda._kernels import (
    KernelSpec,
    Launch,
    Plans,
    cdiv,
    float_template,
    gemm_dims,
    kernel,
)

DTYPES = (mx.float32, mx.float16, mx.bfloat16)
FILES = ("cuda/common.cuh", "cuda/gemm_common.cuh")
KERNEL_FILE = {
    "skinny": "cuda/gemm_skinny.cu",
    "tiled": "cuda/gemm_tiled.cu",
    "f32": "cuda/gemm_f32.cu",
}


@dataclass(frozen=True)
class GemmConfig:
    """One tile configuration. kind: 'skinny' (small M), 'tiled' (large M) or 'f32'."""

    kind: str
    mt: int = 1  # skinny/f32: m16 tiles (f32: rows) per warp
    nt: int = 1  # skinny/f32: n8 tiles (f32: columns) per warp
    wk: int = 1  # skinny: warps splitting K's chunks
    bm: int = 128  # tiled: block tile
    bn: int = 128
    wm: int = 2  # tiled: warps along M and N
    wn: int = 4
    stages: int = 4

    @property
    def threads(self) -> int:
        if self.kind == "skinny":
            return 32 * self.wk
        if self.kind == "tiled":
            return 32 * self.wm * self.wn
        return 128

    @property
    def shared_memory(self) -> int:
        return self.stages * (self.bm + self.bn) * 64 if self.kind == "tiled" else 0

    def grid(self, m: int, n: int) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
        t = self.threads
        if self.kind == "skinny":
            return (cdiv(n, 8 * self.nt) * t, cdiv(m, 16 * self.mt), 1), (t, 1, 1)
        if self.kind == "tiled":
            return (cdiv(n, self.bn) * t, cdiv(m, self.bm), 1), (t, 1, 1)
        warps = cdiv(m, self.mt) * cdiv(n, self.nt)
        return (cdiv(warps, 4) * t, 1, 1), (t, 1, 1)

    def template(self) -> list[tuple[str, int]]:
        if self.kind == "tiled":
            p = (("BM", self.bm), ("BN", self.bn), ("WM", self.wm), ("WN", self.wn))
            return [*p, ("STAGES", self.stages)]
        return [("MT", self.mt), ("NT", self.nt)]  # warps along K: the block size


def choose_config(dtype, m: int, n: int, k: int) -> GemmConfig:
    """The configuration for a problem size. It changes speed only, never bits.

    Half types: the skinny kernel (16-column blocks, K's chunks split over up to 8 warps) up
    to M = 16, where re-reading the activations per column tile is cheap; 64 x 128 tiles up
    to M = 256; 128 x 64 tiles on 4 x 2 warps beyond. The thresholds come from timing every
    candidate on the H200 (tools/cuda_tune.py; docs/cuda-design.md).
    """
    if dtype == mx.float32:
        if m <= 4:
            return GemmConfig("f32", mt=1 << max(0, (m - 1).bit_length()), nt=4)
        return GemmConfig("f32", mt=8, nt=8)
    if m <= 16:
        blocks = cdiv(n, 16)
        wk = max(1, min(8, cdiv(k, 256), cdiv(1056, blocks)))
        return GemmConfig("skinny", mt=1, nt=2, wk=wk)
    if m <= 256:
        return GemmConfig("tiled", bm=64, bn=128, wm=2, wn=4, stages=4)
    return GemmConfig("tiled", bm=128, bn=64, wm=4, wn=2, stages=4)


def configs(dtype) -> list[GemmConfig]:
    """Every configuration the dispatcher can pick for dtype (tests compare them bitwise)."""
    if dtype == mx.float32:
        return [GemmConfig("f32", mt=mt, nt=nt) for mt in (1, 2, 4, 8) for nt in (4, 8)]
    sk = [
        GemmConfig("skinny", mt=mt, nt=nt, wk=wk)
        for mt in (1, 2, 3, 4)
        for nt in (1, 2)
        for wk in (1, 2, 3, 8)
    ]
    return [
        *sk,
        GemmConfig("tiled", bm=64, bn=128, wm=2, wn=4, stages=4),
        GemmConfig("tiled", bm=128, bn=128, wm=2, wn=4, stages=4),
        GemmConfig("tiled", bm=128, bn=64, wm=4, wn=2, stages=4),
    ]


# b arrives as an (N, K) view: the weight itself, or the transpose of a (K, N) right operand.
_B_INIT = """
  const int N = b_shape[0];
  const long long sbn = b_strides[0], sbk = b_strides[1];
"""
_EPI = {
    False: "  bi::Epilogue<T, false> epi{nullptr, 0, 0, "
    "bi::bits_to_float(ALPHA_BITS, ALPHA_NEG), 0.0f};\n",
    True: "  bi::Epilogue<T, true> epi{c, c_strides[0], c_strides[1], "
    "bi::bits_to_float(ALPHA_BITS, ALPHA_NEG), bi::bits_to_float(BETA_BITS, BETA_NEG)};\n",
}
_CALL = {
    "skinny": "  bi::gemm_skinny<T, MT, NT>(A, Bm, M, N, K, epi, out);\n",
    "tiled": "  bi::gemm_tiled<T, BM, BN, WM, WN, STAGES>(A, Bm, M, N, K, epi, out);\n",
}


@cache
def kernel_spec(kind: str, has_c: bool, shared_memory: int) -> KernelSpec:
    """The kernel of a config kind, with or without a c operand (addmm, a bias)."""
    body = "  const int M = a_shape[0], K = a_shape[1];\n" + _B_INIT + _EPI[has_c]
    if kind == "f32":
        body += "  bi::gemm_f32<MT, NT>(a, a_strides[0], a_strides[1], b, sbn, sbk, M, N, K, "
        body += "epi, out);\n"
    else:
        body += (
            "  bi::DenseRows A;\n  A.init(a, a_strides[0], a_strides[1], M, K);\n"
            "  bi::DenseRows Bm;\n  Bm.init(b, sbn, sbk, N, K);\n" + _CALL[kind]
        )
    inputs = ("a", "b", "c") if has_c else ("a", "b")
    name = f"bi_gemm_{kind}{'_c' if has_c else ''}"
    return KernelSpec(name, inputs, ("out",), (*FILES, KERNEL_FILE[kind]), body, shared_memory)


@lru_cache(maxsize=1024)
def template_args(dtype, cfg: GemmConfig, has_c: bool, alpha: float, beta: float):
    """The template arguments of one instantiation of `kernel_spec(cfg.kind, has_c, ...)`."""
    t = [("T", dtype), *cfg.template(), *float_template("ALPHA", alpha)]
    if has_c:
        t += float_template("BETA", beta)
    return t


_PLANS = Plans()


def _plan(a, b, b_kn, c, alpha, beta, config) -> Launch:
    m, n, k = gemm_dims(a, b, b_kn, c, DTYPES)
    dt = a.dtype
    cfg = config or choose_config(dt, m, n, k)
    grid, group = cfg.grid(m, n)
    has_c = c is not None
    return Launch(
        kernel=kernel(kernel_spec(cfg.kind, has_c, cfg.shared_memory)),
        template=template_args(dt, cfg, has_c, float(alpha), float(beta)),
        grid=grid,
        group=group,
        out_shape=(m, n),
        out_dtype=dt,
        out_view=None if a.ndim == 2 else (*a.shape[:-1], n),
    )


def gemm(
    a, b, *, b_kn: bool, c=None, alpha: float = 1.0, beta: float = 1.0, config=None, poison=None
):
    """a (..., K) times b, where b is (K, N) if b_kn else (N, K); plus beta * c if given.

    config forces a tile configuration and poison pre-fills the output (tests). The plan for
    an argument signature is built once; a call then only assembles inputs and launches.
    On a Hopper GPU, bf16/f16 run the wgmma kernels of hopper.py for every M (unless a config
    of this module's own kernels is forced).
    """
    if a.dtype != mx.float32 and not isinstance(config, GemmConfig) and hopper.available():
        return hopper.gemm(
            a, b, b_kn=b_kn, c=c, alpha=alpha, beta=beta, config=config, poison=poison
        )
    sig = (a.dtype, a.shape, b.dtype, b.shape, b_kn, alpha, beta, config)
    if c is not None:
        sig += (c.dtype, c.shape)
    p = _PLANS.get(sig) or _PLANS.build(sig, _plan, a, b, b_kn, c, alpha, beta, config)
    inputs = [a if p.out_view is None else a.reshape(-1, a.shape[-1]), b.T if b_kn else b]
    if c is not None:
        inputs.append(_broadcast_c(c, p.out_view, p.out_shape))
    return p(*inputs, init_value=poison)


def _broadcast_c(c, out_view: tuple | None, mn: tuple[int, int]):
    """c as an (M, N) view: a bias row or a full matrix is broadcast without a copy."""
    while c.ndim > 2 and c.shape[0] == 1:
        c = c.reshape(c.shape[1:])
    if c.ndim <= 2:
        return mx.broadcast_to(c, mn)
    return mx.broadcast_to(c, out_view or mn).reshape(mn)


def linear(x, w, bias=None):
    """x @ w.T (+ bias), w in the nn.Linear layout (N, K), read in place."""
    if bias is None and x.dtype != mx.float32 and hopper.available():
        return hopper.linear(x, w)
    return gemm(x, w, b_kn=False, c=bias)


def _linear_launch_for(x, w, bias=None):
    """The one launch linear made for arguments of these shapes and dtypes, a callable of
    (x, w) with its output, or None where it made another kind of call (a bias, float32, the
    portable kernels, a reshape either side) or has not been called for them yet (only plans
    already built are read)."""
    if bias is not None or x.dtype == mx.float32 or x.dtype != w.dtype or not hopper.available():
        return None
    return hopper.linear_launch(x, w)


linear.launch_for = _linear_launch_for


def grouped_linear(x, ws):
    """[linear(x, w) for w in ws]: sibling projections of one activation.

    Every output element's reduction order depends on K alone, so one launch computing all of
    ws (each weight read through its own pointer, each output written to its own array) gives
    each output the bits of its own launch: on Hopper, up to the few-row kernel's rows, where
    every width is a multiple of one of its block widths (hopper.grouped_linear); elsewhere
    the members run as separate launches."""
    if x.dtype != mx.float32 and hopper.available():
        outs = hopper.grouped_linear(x, ws)
        if outs is not None:
            return outs
    return [linear(x, w) for w in ws]


def _grouped_launch_for(x, ws):
    """The one launch grouped_linear made for arguments of these shapes and dtypes, a
    callable of (x, ws) giving the same outputs, or None where it made none or has not been
    called for them yet (only plans already built are read)."""
    if x.dtype == mx.float32 or not hopper.available():
        return None
    return hopper.group_launch(x, ws, build=False)


grouped_linear.launch_for = _grouped_launch_for


def groups_in_one_launch() -> bool:
    """Whether grouped_linear computes a decode step's group of projections in one launch
    here (Hopper's few-row kernel); elsewhere it launches the members one by one."""
    return hopper.available() and hopper.narrow_enabled()


def matmul(a, b):
    """a @ b for a two-dimensional b of any strides (mlx-lm passes W.T views)."""
    return gemm(a, b, b_kn=True)


def addmm(c, a, b, alpha=1.0, beta=1.0):
    """alpha * (a @ b) + beta * c, accumulated in fp32 and rounded once."""
    return gemm(a, b, b_kn=True, c=c, alpha=alpha, beta=beta)
