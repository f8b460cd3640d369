"""Memory of repeated bi_rl.score calls with and without concatenated sibling projections
(bi_rl.concat), on a random-weight 4-layer bf16 Qwen3 (hidden 1024), CPU. Each score call
concatenates the sets anew; the members' slices of the last concatenation must be freed.

    for c in 0 1; do
        BI_RL_CONCAT_PROJECTIONS=$c python docs/cpu/2026-12-05/concat_score_memory.py
    done
"""

import gc
import os
import sys
import tempfile
from pathlib import Path

sys.path[:0] = ["tests", "."]

import mlx.core as mx  # noqa: E402
import mlx_lm  # noqa: E402
from tiny_models import build_model  # noqa: E402

from bi_rl.score.scorer import Item, ScoreConfig, score  # noqa: E402

d = Path(tempfile.mkdtemp())
p = build_model(d / "m", "qwen3", hidden=1024, layers=4, heads=8, kv_heads=4, dtype="bfloat16")
model, _ = mlx_lm.load(str(p))
mx.eval(model.parameters())
print(
    "concat",
    os.environ.get("BI_RL_CONCAT_PROJECTIONS", ""),
    "weights MB",
    mx.get_active_memory() / 1e6,
)
items = [Item(tuple(i % 50 + 1 for i in range(40)), tuple(i % 50 + 1 for i in range(3, 43)))] * 8
for i in range(4):
    score(model, items, ScoreConfig(batch_size=8))
    gc.collect()
    active, peak = mx.get_active_memory() / 1e6, mx.get_peak_memory() / 1e6
    print(i, "active MB", round(active, 1), "peak MB", round(peak, 1))
