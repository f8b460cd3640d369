"""CUDA backend: batch-invariant kernels for MLX's CUDA backend through mx.fast.cuda_kernel.

Kernel sources live in kernels/cuda/, one launch module per family beside this file:
gemm.py (linear, grouped_linear, matmul, addmm), qmm.py (quantized_matmul,
grouped_quantized_matmul), attention.py
(scaled_dot_product_attention), softmax_kernel.py (softmax over the last axis);
sample_kernel.py is the rollout engine's fused draw and fingerprint (bi_rl.rollout.sampler.draw),
not an op of the mode. Batched matmuls
(attention written by hand) and the mixture-of-experts gathers are composed from the GEMMs
in Python (bi_rl.backends.composed): one invariant 2-D GEMM per right-hand matrix, so they
keep the GEMMs' per-row order. Each
implementation raises Unsupported for arguments it cannot make invariant; the dispatcher
turns that into NotImplementedError in strict mode.
"""

from bi_rl.backends import composed
from bi_rl.backends.base import Backend
from bi_rl.backends.cuda.attention import scaled_dot_product_attention
from bi_rl.backends.cuda.gemm import addmm, grouped_linear, linear, matmul
from bi_rl.backends.cuda.qmm import grouped_quantized_matmul, quantized_matmul
from bi_rl.backends.cuda.softmax_kernel import softmax


def batched_matmul(a, b):
    # The GEMM groups K in chunks counted from k = 0: align each row's reduction to its first
    # nonzero element, so p @ v does not depend on how many masked keys precede a row's keys.
    return composed.batched_matmul(matmul, a, b, align=True)


def gather_mm(a, b, lhs_indices=None, rhs_indices=None, sorted_indices=False):
    return composed.gather_mm(matmul, a, b, lhs_indices, rhs_indices, sorted_indices)


def gather_qmm(x, w, scales, biases=None, lhs_indices=None, rhs_indices=None, *args, **kwargs):
    return composed.gather_qmm(
        quantized_matmul, x, w, scales, biases, lhs_indices, rhs_indices, *args, **kwargs
    )


_PER_MATRIX = "one invariant GEMM per right-hand matrix (bi_rl.backends.composed)"
BACKEND = Backend(
    name="cuda",
    ops={
        f.__name__: f
        for f in (
            linear,
            grouped_linear,
            matmul,
            batched_matmul,
            addmm,
            quantized_matmul,
            grouped_quantized_matmul,
            scaled_dot_product_attention,
            gather_mm,
            gather_qmm,
            softmax,
        )
    },
    how={
        "linear": "tensor-core MMA (bf16/f16) or fmaf (f32, no TF32); K-only reduction order, "
        "fixed 256-k chunks summed in order, no split-K; bias added once in fp32",
        "grouped_linear": "on Hopper up to 16 rows one few-row launch over the weights, each "
        "output its own linear's K-only chain; elsewhere one linear launch per weight",
        "matmul": "same GEMM kernels; b read through its strides (W.T views in place)",
        "addmm": "same GEMM kernels; alpha * acc + beta * c in fp32, rounded once",
        "quantized_matmul": "affine 2/4/8-bit, groups 32/64/128, dequantised in the K loop of "
        "the same GEMM kernels",
        "grouped_quantized_matmul": "on Hopper up to 64 rows one launch over the members, each "
        "output its own quantized_matmul's K-only chain; elsewhere one launch per member",
        "scaled_dot_product_attention": "one kernel for decode and prefill: 64-key blocks and "
        "512-key splits counted from each row's first valid key, fp32 online softmax, splits "
        "folded in order",
        "batched_matmul": _PER_MATRIX + ": per batch element of b, broadcast axes folded into "
        "M, each row reduced from its first nonzero element (leading masked keys skipped)",
        "gather_mm": _PER_MATRIX + ": per expert, over the rows routed to it",
        "gather_qmm": _PER_MATRIX + ": per expert, over the rows routed to it",
        "softmax": "one warp a row, fp32; the sum runs from the row's first nonzero exponential "
        "in a fixed lane order, so row length and padding do not move its bits",
    },
)
