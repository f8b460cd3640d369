"""bi_rl.train.grpo: updates gated on the on-policy check, bit for bit.

Properties: on a batch the current LoRA policy sampled, the gate finds every logprob bit
equal (k3 exactly 0) and the first update sees importance ratios of exactly 1 while its
gradient moves the adapters (the guard); after a perturbation of the in-memory model
between rollout and training (one layer's weights scaled by 1 + 1e-3) the gate refuses,
takes no update, and names the first divergent token with both values, the same token an
independent rescoring finds first; with several epochs or minibatches, updates after the
first are PPO updates against the logged (behaviour) logprobs, their ratios no longer 1;
allow_off_policy reports the mismatch instead of refusing; advantages are group-relative.
"""

import mlx.core as mx
import mlx.optimizers as optim
import mlx_lm
import numpy as np
import pytest
from conftest import cuda_only
from mlx.utils import tree_flatten, tree_unflatten
from tiny_models import build_model

from bi_rl.rollout.engine import EngineConfig
from bi_rl.rollout.generate import generate_samples
from bi_rl.rollout.prompts import Prompt
from bi_rl.rollout.sampler import SamplerConfig
from bi_rl.score.scorer import Item, ScoreConfig, score
from bi_rl.train.grpo import (
    OffPolicyError,
    RolloutBatch,
    UpdateConfig,
    advantages,
    check_on_policy,
    train_on_batch,
)
from bi_rl.train.lora import LoRAConfig, attach

T = 0.9
TEXTS = ["12+34=", "7+8=", "hello", "a b c"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_model(tmp_path_factory.mktemp("grpo") / "m", hidden=64, heads=1)


def _policy(model_dir):
    model, tok = mlx_lm.load(str(model_dir))
    attach(model, LoRAConfig(rank=4), seed=0)
    return model, tok


def _rollout(model, tok) -> RolloutBatch:
    prompts = [
        Prompt(f"p{i}", tuple(tok.encode(t)))
        for i, t in enumerate(["12+34=", "7+8=", "hello", "a b c"])
    ]
    cfg = EngineConfig(n=3, max_tokens=6, batch_size=5)
    samples, _ = generate_samples(model, tok, prompts, SamplerConfig(temperature=T, seed=2), cfg)
    rewards = [len(s.tokens) / 6 + (s.tokens[0] % 3) for s in samples]  # any spread will do
    return RolloutBatch.from_samples(samples, rewards)


def _scale_layer(model, i: int, factor: float) -> None:
    """Scale every weight of block i (between rollout and training: another policy)."""
    layer = model.layers[i]
    scaled = [(k, v * factor) for k, v in tree_flatten(layer.parameters()) if k.endswith("weight")]
    layer.update(tree_unflatten(scaled))
    mx.eval(model.parameters())


def _params(model) -> dict:
    return {k: np.array(v) for k, v in tree_flatten(model.parameters())}


def test_on_policy_batch_is_trained_with_ratios_exactly_one(model_dir):
    model, tok = _policy(model_dir)
    batch = _rollout(model, tok)
    before = _params(model)
    out = train_on_batch(model, optim.Adam(learning_rate=1e-2), batch, UpdateConfig(T))
    check, (upd,) = out["check"], out["updates"]
    assert check["tokens"] == batch.tokens > 0
    assert check["differing"] == 0 and check["k3_max"] == 0.0 and check["k3_mean"] == 0.0
    assert upd["ratio_not_1"] == 0 and upd["tokens"] == batch.tokens
    assert upd["ratio_min"] == upd["ratio_max"] == 1.0 and upd["grad_norm"] > 0
    after = _params(model)
    moved = [k for k in before if not np.array_equal(before[k], after[k])]
    assert moved and all(k.rsplit(".", 1)[-1] in ("lora_a", "lora_b") for k in moved), (
        "guard: the step is taken, and only the adapters move"
    )


def test_perturbed_model_is_refused_naming_the_first_divergent_token(model_dir):
    model, tok = _policy(model_dir)
    batch = _rollout(model, tok)
    _scale_layer(model, 1, 1 + 1e-3)
    # Independently: where does the perturbed model's rescoring first differ from the log?
    scored = score(
        model,
        [Item(p, c) for p, c in zip(batch.prompts, batch.completions, strict=True)],
        ScoreConfig(temperature=T),
    )
    first = next(
        (i, int(np.argmax(s.logprob_bits != b)))
        for i, (s, b) in enumerate(zip(scored, batch.logprob_bits, strict=True))
        if not np.array_equal(s.logprob_bits, b)
    )
    i, j = first
    opt = optim.Adam(learning_rate=1e-2)
    before = _params(model)
    with pytest.raises(OffPolicyError) as e:
        train_on_batch(model, opt, batch, UpdateConfig(T))
    d = e.value.report.first_divergence
    assert (d.sample, d.position, d.token) == (i, j, batch.completions[i][j])
    assert d.rollout_bits == int(batch.logprob_bits[i][j])
    assert d.rescored_bits == int(scored[i].logprob_bits[j]) != d.rollout_bits
    msg = str(e.value)
    assert f"{batch.labels[i]}, position {j} (token {batch.completions[i][j]})" in msg, msg
    assert f"0x{d.rollout_bits:08x}" in msg and f"0x{d.rescored_bits:08x}" in msg
    assert "no update taken" in msg and "\n" not in msg
    after = _params(model)
    assert all(np.array_equal(before[k], after[k]) for k in before), "no update on refusal"
    assert int(opt.state.get("step", 0)) == 0, "the optimizer never stepped"


def test_later_updates_use_the_logged_logprobs_as_behaviour(model_dir):
    model, tok = _policy(model_dir)
    batch = _rollout(model, tok)
    cfg = UpdateConfig(T, clip=0.2, epochs=2, minibatch_size=5)
    out = train_on_batch(model, optim.Adam(learning_rate=3e-2), batch, cfg)
    ups = out["updates"]
    assert [(u["epoch"], u["minibatch"]) for u in ups] == [
        (e, m) for e in (1, 2) for m in (1, 2, 3)
    ]
    assert ups[0]["ratio_not_1"] == 0, "the first update runs at the rollout policy"
    assert all(u["ratio_not_1"] > 0 for u in ups[1:]), "later ones after the weights moved"
    # The last epoch's ratios are current / logged: recompute them independently.
    report, _ = check_on_policy(model, batch, UpdateConfig(T, allow_off_policy=True))
    assert report.differing > 0 and report.k3_max > 0


def test_allow_off_policy_reports_instead_of_refusing(model_dir):
    model, tok = _policy(model_dir)
    batch = _rollout(model, tok)
    _scale_layer(model, 0, 1 + 1e-3)
    out = train_on_batch(
        model, optim.Adam(learning_rate=1e-3), batch, UpdateConfig(T, allow_off_policy=True)
    )
    assert out["check"]["differing"] > 0 and out["check"]["k3_max"] > 0
    assert out["updates"][0]["ratio_not_1"] > 0


def test_advantages_are_group_relative():
    adv = advantages(np.array([1.0, 0.0, 2.0, 2.0, 5.0]), [0, 0, 1, 1, 2])
    assert adv.dtype == np.float32
    a = 0.5 / (0.5 + 1e-4)  # group (1, 0): mean 0.5, std 0.5; a lone sample gets 0
    np.testing.assert_allclose(adv, [a, -a, 0, 0, 0], rtol=1e-6)


@cuda_only
@pytest.mark.cuda
def test_bf16_model_with_float32_adapters_is_on_policy_on_the_gpu(tmp_path):
    """On a batch-variant backend: the mode keeps the gate exact (float32 LoRA weights meet
    bfloat16 activations through promoted invariant GEMMs); stock MLX is the control."""
    path = build_model(tmp_path / "bf16", hidden=64, heads=1, dtype="bfloat16")
    results = {}
    for mode in ("strict", "off"):
        model, tok = _policy(path)
        prompts = [Prompt(f"p{i}", tuple(tok.encode(t))) for i, t in enumerate(TEXTS)]
        cfg = EngineConfig(n=4, max_tokens=16, batch_size=7, mode=mode)
        samples, _ = generate_samples(model, tok, prompts, SamplerConfig(T, seed=0), cfg)
        batch = RolloutBatch.from_samples(samples, [s.tokens[0] % 3 for s in samples])
        ucfg = UpdateConfig(T, mode=mode, allow_off_policy=mode == "off")
        results[mode] = train_on_batch(model, optim.Adam(learning_rate=1e-3), batch, ucfg)
    strict, off = results["strict"], results["off"]
    assert strict["check"]["differing"] == 0 and strict["check"]["k3_max"] == 0.0
    assert strict["updates"][0]["ratio_not_1"] == 0
    assert off["check"]["differing"] > 0, "control: stock MLX on this backend is batch-variant"
