"""Tests for bi_rl.assets: the embedded default model loads offline through mlx-lm, is small,
solves a measured share of its held-out prompts greedily (but not all of them, so RL has a
reward to raise), gives a mix of right and wrong answers at temperature 1, and its tokenizer
and prompt set agree with the addition task.
"""

from __future__ import annotations

import hashlib
import json

import mlx.core as mx
import numpy as np
import pytest

from bi_rl.assets import DEFAULT_MODEL, DEFAULT_PROMPTS
from bi_rl.tasks.addition import (
    ALPHABET,
    BOS_ID,
    EOS_ID,
    PAD_ID,
    UNK_ID,
    VOCAB,
    decode,
    encode,
    is_heldout,
    reward,
)

# Measured on the shipped weights (bi_rl/assets/tiny-adder/README.md): greedy decoding solves
# 42 of the 64 shipped prompts. The bounds leave a margin for a platform whose float32
# rounding flips a near-tie; the ceiling says the model is deliberately imperfect.
GREEDY_MIN_CORRECT = 38
GREEDY_MAX_CORRECT = 52
MAX_NEW_TOKENS = 5  # four answer digits and <eos>
WEIGHTS_SHA256 = "3f33fe2b048e92f06e40b9eb1623dc463befdeb5517a18e67229080ea810c9c8"


@pytest.fixture(scope="module")
def loaded():
    import mlx_lm
    import mlx_lm.utils

    def no_hub(*args, **kwargs):
        raise AssertionError("the embedded model must load without contacting a hub")

    original = mlx_lm.utils.snapshot_download
    mlx_lm.utils.snapshot_download = no_hub
    try:
        model, tokenizer = mlx_lm.load(str(DEFAULT_MODEL))
    finally:
        mlx_lm.utils.snapshot_download = original
    return model, tokenizer


@pytest.fixture(scope="module")
def prompts():
    with open(DEFAULT_PROMPTS) as f:
        return [json.loads(line) for line in f]


def greedy_mlx_lm(model, tokenizer, prompt: str) -> tuple[str, bool]:
    """Greedy completion through mlx-lm's own KV-cached generation loop."""
    from mlx_lm.generate import generate_step

    ids = []
    for tok, _ in generate_step(mx.array(tokenizer.encode(prompt)), model, max_tokens=8):
        ids.append(int(tok))
        if ids[-1] == EOS_ID or len(ids) == MAX_NEW_TOKENS:
            break
    return decode(ids)


def test_assets_are_inside_the_package_and_small():
    import bi_rl.assets

    assert DEFAULT_MODEL.is_absolute() and DEFAULT_MODEL.parent == bi_rl.assets.ASSETS_DIR
    names = {p.name for p in DEFAULT_MODEL.iterdir()}
    for required in (
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "prompts.jsonl",
        "README.md",
    ):
        assert required in names, f"{required} is missing from {DEFAULT_MODEL}"
    assert (DEFAULT_MODEL / "model.safetensors").stat().st_size < 2**20, "weights stay under 1 MiB"


def test_weights_are_the_ones_the_readme_describes():
    # Golden rollout logs and the accuracy bounds below are tied to these exact bits; a
    # retrained model must update this digest, its README and the logs together.
    digest = hashlib.sha256((DEFAULT_MODEL / "model.safetensors").read_bytes()).hexdigest()
    assert digest == WEIGHTS_SHA256
    assert WEIGHTS_SHA256 in (DEFAULT_MODEL / "README.md").read_text()


def test_config_is_a_plain_qwen2():
    config = json.loads((DEFAULT_MODEL / "config.json").read_text())
    assert config["model_type"] == "qwen2"
    assert config["vocab_size"] == len(VOCAB)
    assert config["eos_token_id"] == EOS_ID and config["bos_token_id"] == BOS_ID
    head_dim = config["hidden_size"] // config["num_attention_heads"]
    assert head_dim == 64, "head size 64: the invariant attention kernels take it everywhere"
    assert "quantization" not in config


def test_model_loads_offline_in_float32(loaded):
    from mlx.utils import tree_flatten

    model, tokenizer = loaded
    params = tree_flatten(model.parameters())
    assert {v.dtype for _, v in params} == {mx.float32}
    assert tokenizer.eos_token_id == EOS_ID
    assert not tokenizer.has_chat_template, "prompts are raw text; there is no chat template"


def test_prompt_set_is_held_out_and_well_formed(prompts):
    assert len(prompts) == 64
    assert len({p["id"] for p in prompts}) == len(prompts)
    for p in prompts:
        assert set(p) == {"id", "prompt", "answer"}
        a, b = p["prompt"].rstrip("=").split("+")
        assert p["prompt"] == f"{a}+{b}=" and len(a) == len(b) == 3
        assert int(p["answer"]) == int(a) + int(b) and len(p["answer"]) == 4
        assert is_heldout(int(a), int(b)), "the training script never saw this pair"


def test_tokenizer_round_trip_on_the_prompt_set(loaded, prompts):
    _, tokenizer = loaded
    assert (
        tokenizer.pad_token_id,
        tokenizer.bos_token_id,
        tokenizer.unk_token_id,
    ) == (PAD_ID, BOS_ID, UNK_ID)
    for p in prompts:
        ids = tokenizer.encode(p["prompt"])
        assert ids == encode(p["prompt"]) and ids[0] == BOS_ID and UNK_ID not in ids
        for text in (p["prompt"], p["answer"], p["prompt"] + p["answer"]):
            body = tokenizer.encode(text, add_special_tokens=False)
            assert len(body) == len(text) and set(text) <= set(ALPHABET)
            assert tokenizer.decode(body) == text
            assert tokenizer.encode(tokenizer.decode(body), add_special_tokens=False) == body


def test_greedy_accuracy_on_the_prompt_set(loaded, prompts):
    model, tokenizer = loaded
    outcomes = [greedy_mlx_lm(model, tokenizer, p["prompt"]) for p in prompts]
    correct = sum(
        reward(p["answer"], text, "stop" if stopped else "length")
        for p, (text, stopped) in zip(prompts, outcomes, strict=True)
    )
    assert GREEDY_MIN_CORRECT <= correct <= GREEDY_MAX_CORRECT, (
        f"greedy solved {correct} of {len(prompts)} (expected {GREEDY_MIN_CORRECT}.."
        f"{GREEDY_MAX_CORRECT})"
    )
    assert all(stopped for _, stopped in outcomes), "every greedy answer ends with <eos>"


def test_sampling_at_temperature_one_gives_right_and_wrong_answers(loaded, prompts):
    model, _ = loaded
    rows = [encode(p["prompt"]) for p in prompts]  # all the same length: one batch
    tokens = mx.array(rows)
    for t in range(MAX_NEW_TOKENS):
        logits = model(tokens)[:, -1, :].astype(mx.float32)
        nxt = mx.random.categorical(logits, key=mx.random.key(1000 + t))
        tokens = mx.concatenate([tokens, nxt.astype(mx.int32)[:, None]], axis=1)
    gen = np.array(tokens[:, len(rows[0]) :]).tolist()
    rewards = []
    for p, ids in zip(prompts, gen, strict=True):
        text, stopped = decode(ids)
        rewards.append(reward(p["answer"], text, "stop" if stopped else "length"))
    assert 0 < sum(rewards) < len(rewards), f"sampled rewards should be mixed, got {sum(rewards)}"
