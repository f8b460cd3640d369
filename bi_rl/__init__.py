"""bi-rl: batch-invariant RL rollouts and bitwise logprob rescoring for MLX.

The one mode switch and the invariant ops:

    import bi_rl
    with bi_rl.batch_invariant_mode():      # strict: refuses what it cannot make invariant
        logits = model(tokens)              # mlx-lm models run unchanged

    y = bi_rl.linear(x, w, bias)            # or call the ops directly

For RL trainers (imported on first use, so `import bi_rl` stays cheap):

    bi_rl.batch_generate(model, tokenizer, prompts, ...)   # mlx-lm's call, invariant rollouts
    bi_rl.read_dataset("rollouts/run.jsonl")               # a rollout log as a datasets.Dataset
"""

from bi_rl.backends import active as active_backend
from bi_rl.mode import batch_invariant_mode, compile, patched_symbols, suspended
from bi_rl.ops import (
    BatchVariantWarning,
    addmm,
    gather_mm,
    gather_qmm,
    linear,
    matmul,
    quantized_matmul,
    scaled_dot_product_attention,
)

__version__ = "0.1.0"

# Name -> module of the attributes loaded on first access (they pull in mlx-lm, datasets).
_LAZY = {
    "batch_generate": "bi_rl.rollout.generate",
    "read_dataset": "bi_rl.score.dataset",
}


def __getattr__(name):
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'bi_rl' has no attribute {name!r}")


__all__ = [
    "BatchVariantWarning",
    "__version__",
    "active_backend",
    "addmm",
    "batch_generate",
    "batch_invariant_mode",
    "compile",
    "gather_mm",
    "gather_qmm",
    "linear",
    "matmul",
    "patched_symbols",
    "quantized_matmul",
    "read_dataset",
    "scaled_dot_product_attention",
    "suspended",
]
