"""Metal backend: no batch-invariant kernels yet.

Stock MLX on Metal switches GEMM and attention kernels with the batch and query sizes, so
nothing is registered here: strict mode raises NotImplementedError for every op, and
strict=False falls back to stock MLX with one warning per op.
"""

from bi_rl.backends.base import Backend

BACKEND = Backend(name="metal")
