"""Is MLX's stock gradient reproducible bit for bit on this device? The trainer test's tiny
model (tests/tiny_models.py), the masked sum of target logprobs through bi_rl's stock path,
its gradient computed three times on the default device and once on the CPU; prints, per
weight, whether the repeats agree in every bit."""

import sys

import mlx.core as mx
import mlx.nn as nn
import mlx_lm
import numpy as np
from mlx.utils import tree_flatten

sys.path.insert(0, "tests")
from tiny_models import build_model  # noqa: E402

from bi_rl.score.policy import make_batch, stock_logprobs  # noqa: E402
from bi_rl.score.scorer import Item  # noqa: E402

model, _ = mlx_lm.load(str(build_model(__import__("pathlib").Path("/tmp/grad-repro"))))
rng = np.random.default_rng(0)
items = [
    Item(
        tuple(int(t) for t in rng.integers(4, 40, n)), tuple(int(t) for t in rng.integers(4, 40, 8))
    )
    for n in (1, 3, 6, 11, 2, 9)
]
batch = make_batch(items)


def grads():
    _, g = nn.value_and_grad(model, lambda m: stock_logprobs(m, batch, 0.8).sum())(model)
    mx.eval(g)
    return {k: np.array(v).view(np.uint32) for k, v in tree_flatten(g)}


print("device", mx.default_device())
runs = [grads() for _ in range(3)]
for k in runs[0]:
    same = all(np.array_equal(runs[0][k], r[k]) for r in runs[1:])
    n = max(int((runs[0][k] != r[k]).sum()) for r in runs[1:])
    print(f"{k}: repeats {'agree' if same else f'differ in up to {n} elements'}")
