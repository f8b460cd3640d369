"""Batch-invariant quantized matmul on MLX's CUDA backend (affine 2-8 bit, groups 32/64/128).

x @ dequantize(w).T with w packed by mx.quantize: the weight is dequantised inside the K loop
of the GEMM kernels (kernels/cuda/qmm.cu on top of gemm_*.cu) and reduced in the same K-only
order, so row i of the output is the same bits alone or in any batch. MLX's affine widths
(2, 3, 4, 5, 6, 8 bits) are supported; other modes and transpose=False raise Unsupported.
On Hopper, bf16/f16 activations run hopper_qmm.py's wgmma kernel at every M; float32
activations multiply the dequantised weight on the float32 GEMM (no TF32).
"""

from __future__ import annotations

from functools import cache, lru_cache

import mlx.core as mx

from bi_rl.backends.base import Unsupported, quant_params
from bi_rl.backends.cuda import hopper, hopper_qmm
from bi_rl.backends.cuda._kernels import KernelSpec, Launch, Plans, kernel, rows
from bi_rl.backends.cuda.gemm import FILES as GEMM_FILES
from bi_rl.backends.cuda.gemm import KERNEL_FILE, GemmConfig, choose_config, linear

BITS = (2, 3, 4, 5, 6, 8)
GROUPS = (32, 64, 128)

_CALL = {
    "skinny": "  bi::gemm_skinny<T, MT, NT>(A, Bq, M, N, K, epi, out);\n",
    "tiled": "  bi::gemm_tiled<T, BM, BN, WM, WN, STAGES>(A, Bq, M, N, K, epi, out);\n",
}
_BODY = """
  const int M = x_shape[0], K = x_shape[1], N = w_shape[0];
  bi::DenseRows A;
  A.init(x, x_strides[0], x_strides[1], M, K);
  bi::QuantRows<T, BITS> Bq{w, scales, biases,
      w_strides[0], w_strides[1], scales_strides[0], scales_strides[1],
      biases_strides[0], biases_strides[1], N, K, __ffs(K / scales_shape[1]) - 1};
  bi::Epilogue<T, false> epi{nullptr, 0, 0, 1.0f, 0.0f};
"""


@cache
def kernel_spec(kind: str, shared_memory: int) -> KernelSpec:
    """The quantized-weight kernel of a GEMM config kind ("skinny" or "tiled")."""
    return KernelSpec(
        f"bi_qmm_{kind}",
        ("x", "w", "scales", "biases"),
        ("out",),
        (*GEMM_FILES, KERNEL_FILE[kind], "cuda/qmm.cu"),
        _BODY + _CALL[kind],
        shared_memory,
    )


@lru_cache(maxsize=1024)
def template_args(dtype, cfg: GemmConfig, bits: int):
    """The template arguments of one instantiation of `kernel_spec(cfg.kind, ...)`."""
    return [("T", dtype), *cfg.template(), ("BITS", bits)]


_PLANS = Plans()
_F32 = "f32"  # the plan that hands the call to the float32 GEMM


def _plan(
    x, w, scales, biases, transpose, group_size, bits, mode, config
) -> Launch | hopper_qmm.Plan | str:
    if mode != "affine":
        raise Unsupported(f"quantized_matmul mode={mode} (affine only)")
    if bits not in BITS:
        raise Unsupported(f"quantized_matmul bits={bits}")
    if group_size not in GROUPS:
        raise Unsupported(f"quantized_matmul group_size={group_size}")
    if not transpose:
        raise Unsupported("quantized_matmul transpose=False")
    if biases is None:
        raise Unsupported("quantized_matmul without biases")
    if x.dtype not in (mx.float16, mx.bfloat16, mx.float32):
        raise Unsupported(f"quantized_matmul dtype {x.dtype}")
    if x.dtype != mx.float32 and (scales.dtype != x.dtype or biases.dtype != x.dtype):
        raise Unsupported(f"quantized_matmul scales {scales.dtype} with x {x.dtype}")
    if w.ndim != 2 or w.dtype != mx.uint32:
        raise Unsupported(f"quantized_matmul weight {tuple(w.shape)} {w.dtype}")
    k = x.shape[-1]
    n = w.shape[0]
    if w.shape[1] * 32 // bits != k or tuple(scales.shape) != (n, k // group_size):
        raise ValueError(
            f"quantized_matmul shapes x {tuple(x.shape)}, w {tuple(w.shape)}, "
            f"scales {tuple(scales.shape)} do not agree for bits={bits}, group_size={group_size}"
        )
    if tuple(biases.shape) != tuple(scales.shape):
        raise ValueError(f"quantized_matmul biases {tuple(biases.shape)} != scales")
    m = rows(x.shape)
    if m == 0:
        raise Unsupported("quantized_matmul with M=0")
    if x.dtype == mx.float32:
        return _F32
    if hopper.available() and not isinstance(config, GemmConfig):
        return hopper_qmm.plan(x, w, scales, biases, group_size, bits, config)
    cfg = config or choose_config(x.dtype, m, n, k)
    grid, group = cfg.grid(m, n)
    return Launch(
        kernel=kernel(kernel_spec(cfg.kind, cfg.shared_memory)),
        template=template_args(x.dtype, cfg, bits),
        grid=grid,
        group=group,
        out_shape=(m, n),
        out_dtype=x.dtype,
        out_view=None if x.ndim == 2 else (*x.shape[:-1], n),
    )


def quantized_matmul(
    x,
    w,
    scales,
    biases=None,
    transpose=True,
    group_size=None,
    bits=None,
    mode="affine",
    *,
    config=None,
    poison=None,
):
    """mx.quantized_matmul's signature; config and poison (an output pre-fill) serve tests."""
    group_size, bits = quant_params(group_size, bits)
    sig = _sig(x, w, scales, biases, transpose, group_size, bits, mode, config)
    p = _PLANS.get(sig) or _PLANS.build(
        sig, _plan, x, w, scales, biases, transpose, group_size, bits, mode, config
    )
    if type(p) is hopper_qmm.Plan:
        return p.run(x, w, scales, biases, poison)
    if p is _F32:
        # float32 activations: the weight dequantised (an elementwise op, so each value is a
        # function of the weight alone) times x on the no-TF32 float32 GEMM, K-ordered too.
        wd = mx.dequantize(w, scales, biases, group_size=group_size, bits=bits)
        return linear(x, wd.astype(mx.float32))
    x2 = x if p.out_view is None else x.reshape(-1, x.shape[-1])
    return p(x2, w, scales, biases, init_value=poison)


def _sig(x, w, scales, biases, transpose, group_size: int, bits: int, mode, config) -> tuple:
    sig = (x.dtype, x.shape, w.dtype, w.shape, scales.dtype, scales.shape, biases is None)
    sig += (transpose, group_size, bits, mode, config)
    return sig if biases is None else sig + (biases.dtype, biases.shape)


def _launch_for(
    x, w, scales, biases=None, transpose=True, group_size=None, bits=None, mode="affine"
):
    """The one launch quantized_matmul made for arguments of these shapes and dtypes, a
    callable of (x, w, scales, biases) with its output, or None where it made another kind of
    call (float32, the portable kernels, a reshape either side) or has not been called for
    them yet: only plans already built are read, so every check of that call stays its own."""
    group_size, bits = quant_params(group_size, bits)
    p = _PLANS.get(_sig(x, w, scales, biases, transpose, group_size, bits, mode, None))
    return p.launch if type(p) is hopper_qmm.Plan and not p.reshape else None


quantized_matmul.launch_for = _launch_for


_CHECKED = Plans()  # grouped signatures whose members all passed quantized_matmul's checks


def grouped_quantized_matmul(x, members, group_size=None, bits=None):
    """[quantized_matmul(x, w, s, b, True, group_size, bits) for (w, s, b) in members]:
    sibling quantized projections of one activation (q/k/v, gate/up).

    Each output element's reduction order depends on K alone, so one launch computing every
    member (each read through its own pointers, each output written to its own array) gives
    each output the bits of its own launch: on Hopper, up to hopper_qmm.GROUP_ROWS rows, once
    each member passed quantized_matmul's checks (its plan is built, or its error raised, as a
    single call's would be; then remembered for the signature); elsewhere the members run as
    separate launches."""
    group_size, bits = quant_params(group_size, bits)
    sig = _group_sig(x, members, group_size, bits)
    ok = _CHECKED.get(sig)
    if ok is None:
        ok = _CHECKED.build(sig, _all_on_hopper, x, members, group_size, bits)
    if ok:
        outs = hopper_qmm.grouped_quantized_matmul(x, members, group_size, bits)
        if outs is not None:
            return outs
    return [quantized_matmul(x, w, s, b, True, group_size, bits) for w, s, b in members]


def _group_sig(x, members, group_size: int, bits: int) -> tuple:
    sig = (x.dtype, x.shape, group_size, bits)
    for w, s, b in members:
        sig += (w.dtype, w.shape, s.dtype, s.shape, None if b is None else (b.dtype, b.shape))
    return sig


def _grouped_launch_for(x, members, group_size=None, bits=None):
    """The one launch grouped_quantized_matmul made for arguments of these shapes and dtypes,
    a callable of (x, members) giving the same outputs, or None where it made none (members
    run one by one) or has not been called for them yet: only plans already built are read,
    so every check of that first call stays its own."""
    group_size, bits = quant_params(group_size, bits)
    if not _CHECKED.get(_group_sig(x, members, group_size, bits)):
        return None
    return hopper_qmm.group_launch(x, members, group_size, bits, build=False)


grouped_quantized_matmul.launch_for = _grouped_launch_for


def _all_on_hopper(x, members, group_size: int, bits: int) -> bool:
    """Whether every member's own call would run the Hopper kernel (its checks raise here as
    that call would raise them)."""
    if x.dtype not in hopper.HALF or not hopper.available():
        return False
    if len(members) not in hopper_qmm.GROUP_SIZES:
        return False
    return all(
        type(_plan(x, w, s, b, True, group_size, bits, "affine", None)) is hopper_qmm.Plan
        for w, s, b in members
    )
