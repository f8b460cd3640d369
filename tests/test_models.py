"""mlx-lm models run unchanged inside the mode, eager and compiled, with stock's bits on the CPU.

On the CPU stock MLX is itself invariant, so the mode must change nothing bitwise there; a
counting backend proves the mode's path really ran (every Linear and attention call).
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import pytest
from conftest import counting_backend, differing
from mlx_lm.models import llama, qwen2
from mlx_lm.models.cache import make_prompt_cache

import bi_rl
from bi_rl import backends


def tiny_qwen2():
    args = qwen2.ModelArgs(
        model_type="qwen2",
        hidden_size=64,
        num_hidden_layers=2,
        intermediate_size=96,
        num_attention_heads=4,
        num_key_value_heads=2,
        rms_norm_eps=1e-6,
        vocab_size=97,
        rope_theta=10000.0,
        tie_word_embeddings=True,
    )
    return qwen2.Model(args)


def tiny_llama():
    args = llama.ModelArgs(
        model_type="llama",
        hidden_size=64,
        num_hidden_layers=2,
        intermediate_size=96,
        num_attention_heads=4,
        num_key_value_heads=2,
        rms_norm_eps=1e-6,
        vocab_size=97,
        tie_word_embeddings=False,
    )
    return llama.Model(args)


def build(kind: str, dtype):
    mx.random.seed({"qwen2": 1, "llama": 2, "qwen2-4bit": 3}[kind])
    model = tiny_llama() if kind == "llama" else tiny_qwen2()
    model.set_dtype(dtype)
    if kind == "qwen2-4bit":
        nn.quantize(model, group_size=32, bits=4)
    mx.eval(model.parameters())
    return model


def run(model, tokens, compiled: bool):
    """Eager: prefill then three cached decode steps. Compiled: mx.compile'd full forwards
    (MLX cannot compile over a KVCache argument) at three lengths. Returns all logits."""
    if compiled:
        forward = mx.compile(lambda t: model(t))
        outs = [forward(tokens[:, :n]) for n in (5, 6, tokens.shape[1])]
        mx.eval(outs)
        return outs
    cache = make_prompt_cache(model)
    outs = [model(tokens, cache=cache)]
    for _ in range(3):
        outs.append(model(mx.argmax(outs[-1][:, -1:], axis=-1), cache=cache))
    mx.eval(outs)
    assert cache[0].offset == tokens.shape[1] + 3, "the cache did not grow"
    return outs


cpu_only = pytest.mark.skipif(
    backends.default_name() != "cpu",
    reason="stock MLX is invariant (so equal to the mode) on the CPU only",
)


@cpu_only
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("dtype", [mx.float32, mx.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("kind", ["qwen2", "llama", "qwen2-4bit"])
def test_model_inside_the_mode_has_stock_bits_on_cpu(kind, dtype, compiled):
    model = build(kind, dtype)
    if kind.startswith("qwen2"):
        assert "bias" in model.model.layers[0].self_attn.q_proj, "Qwen2 must carry q/k/v bias"
    tokens = mx.array([[5, 17, 3, 42, 8, 61, 9]])
    stock = run(model, tokens, compiled)
    spy, calls = counting_backend(backends.get("cpu"))
    with backends.use(spy), bi_rl.batch_invariant_mode():
        ours = run(model, tokens, compiled)
    for i, (a, b) in enumerate(zip(stock, ours, strict=True)):
        assert differing(a, b) == 0, f"step {i}: the mode changed bits on the CPU"
    gemm = "quantized_matmul" if kind.endswith("4bit") else "linear"
    assert calls[gemm] > 0, "the model's projections did not go through the mode"
    assert calls["scaled_dot_product_attention"] > 0, "attention did not go through the mode"
