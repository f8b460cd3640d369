"""examples/grpo.py: the GRPO loop runs and is on-policy to the bit.

Properties: two steps on a tiny model exit 0 in strict mode; every step logs zero
differing tokens between rollout and rescoring, k3 exactly 0 and every importance ratio
exactly 1, while the update still moves the weights (with a stand-in reward, since a random
model earns none).
"""

import json

import mlx_lm
import numpy as np
from conftest import load_script
from mlx.utils import tree_flatten
from tiny_models import build_model


def test_two_steps_are_exactly_on_policy(tmp_path):
    grpo = load_script("examples/grpo.py")
    model_dir = build_model(tmp_path / "m", hidden=32)
    log = tmp_path / "metrics.jsonl"
    argv = [
        "--model",
        str(model_dir),
        "--steps",
        "2",
        "--prompts",
        "3",
        "--n",
        "4",
        "--eval-every",
        "2",
        "--eval-size",
        "8",
        "--lr",
        "1e-2",
        "--log",
        str(log),
    ]
    before = {k: np.array(v) for k, v in tree_flatten(mlx_lm.load(str(model_dir))[0].parameters())}
    seen = {}
    real_update = grpo.train_on_batch

    def spy(model, *args, **kwargs):
        out = real_update(model, *args, **kwargs)
        seen["after"] = {k: np.array(v) for k, v in tree_flatten(model.parameters())}
        return out

    grpo.train_on_batch = spy
    # A random model never adds correctly: reward length instead, so advantages are not 0.
    grpo.partial_reward = lambda answer, text, finish: len(text) / 10
    assert grpo.main(argv) == 0
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        assert r["tokens"] > 0 and r["differing"] == 0
        assert r["k3_mean"] == r["k3_max"] == 0.0 and r["ratio_not_1"] == 0
        assert r["ratio_min"] == r["ratio_max"] == 1.0 and r["grad_norm"] > 0
    assert "heldout_greedy_acc" in rows[-1]
    moved = [k for k in before if not np.array_equal(before[k], seen["after"][k])]
    assert moved, "the update must change the weights"
