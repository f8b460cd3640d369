"""CUDA backend: batch-invariant kernels for MLX's CUDA backend through mx.fast.cuda_kernel.

No kernel is registered yet, so strict mode raises NotImplementedError for every op on CUDA
and strict=False falls back to stock MLX (which is batch-variant there; see README).
"""

from bi_rl.backends.base import Backend

BACKEND = Backend(name="cuda")
