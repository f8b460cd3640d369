"""Files that ship inside the package: the embedded default model and its prompt set.

``DEFAULT_MODEL`` is an mlx-lm model directory (a tiny Qwen2 trained on the addition task
of bi_rl.tasks.addition by examples/train_tiny_adder.py; its README says how) and
``DEFAULT_PROMPTS`` a JSONL file of held-out problems with fields "id", "prompt" and
"answer". Both paths resolve inside the installed package, so they work from a wheel and
from a source checkout alike, and loading them never needs a network.

``DEFAULT_MAX_TOKENS`` is bi-rollout's completion limit for the embedded model: its config
declares 64 positions, its prompts are 9 tokens (with <bos>) and its answers 5 (four
digits and <eos>), so 32 fits the context with prompts of up to 32 tokens.
"""

from __future__ import annotations

from pathlib import Path

ASSETS_DIR = Path(__file__).resolve().parent
DEFAULT_MODEL = ASSETS_DIR / "tiny-adder"
DEFAULT_PROMPTS = DEFAULT_MODEL / "prompts.jsonl"
DEFAULT_MAX_TOKENS = 32

__all__ = ["ASSETS_DIR", "DEFAULT_MAX_TOKENS", "DEFAULT_MODEL", "DEFAULT_PROMPTS"]
