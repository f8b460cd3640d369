"""CUDA backend: batch-invariant kernels for MLX's CUDA backend through mx.fast.cuda_kernel.

Kernel sources live in kernels/cuda/, one launch module per family beside this file:
gemm.py (linear, matmul, addmm), qmm.py (quantized_matmul), attention.py
(scaled_dot_product_attention). Each implementation raises Unsupported for arguments it
cannot make invariant; the dispatcher turns that into NotImplementedError in strict mode.
"""

from bi_rl.backends.base import Backend
from bi_rl.backends.cuda.attention import scaled_dot_product_attention
from bi_rl.backends.cuda.gemm import addmm, linear, matmul
from bi_rl.backends.cuda.qmm import quantized_matmul

BACKEND = Backend(
    name="cuda",
    ops={
        f.__name__: f
        for f in (linear, matmul, addmm, quantized_matmul, scaled_dot_product_attention)
    },
    how={
        "linear": "tensor-core MMA (bf16/f16) or fmaf (f32, no TF32); K-only reduction order, "
        "fixed 256-k chunks summed in order, no split-K; bias added once in fp32",
        "matmul": "same GEMM kernels; b read through its strides (W.T views in place)",
        "addmm": "same GEMM kernels; alpha * acc + beta * c in fp32, rounded once",
        "quantized_matmul": "affine 2/4/8-bit, groups 32/64/128, dequantised in the K loop of "
        "the same GEMM kernels",
        "scaled_dot_product_attention": "one kernel for decode and prefill: 64-key blocks and "
        "256-key splits counted from each row's first valid key, fp32 online softmax, splits "
        "folded in order",
    },
)
