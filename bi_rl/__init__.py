"""bi-rl: batch-invariant RL rollouts and bitwise logprob rescoring for MLX.

The one mode switch and the invariant ops:

    import bi_rl
    with bi_rl.batch_invariant_mode():      # strict: refuses what it cannot make invariant
        logits = model(tokens)              # mlx-lm models run unchanged

    y = bi_rl.linear(x, w, bias)            # or call the ops directly
"""

from bi_rl.backends import active as active_backend
from bi_rl.mode import batch_invariant_mode, compile, patched_symbols, suspended
from bi_rl.ops import (
    BatchVariantWarning,
    addmm,
    linear,
    matmul,
    quantized_matmul,
    scaled_dot_product_attention,
)

__version__ = "0.1.0"

__all__ = [
    "BatchVariantWarning",
    "__version__",
    "active_backend",
    "addmm",
    "batch_invariant_mode",
    "compile",
    "linear",
    "matmul",
    "patched_symbols",
    "quantized_matmul",
    "scaled_dot_product_attention",
    "suspended",
]
