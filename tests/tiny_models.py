"""Tiny random-weight mlx-lm models with a character tokenizer, saved as loadable directories.

Weights come from explicit random keys (no global random state), so a directory built twice
holds the same bytes. `mlx_lm.load(path)` loads the result offline.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import mlx.core as mx  # noqa: E402
from mlx.utils import tree_flatten, tree_unflatten  # noqa: E402

CHARS = list("0123456789+=-*/ abcdefghijklmnopqrstuvwxyz.,?!\n")
SPECIALS = ["<pad>", "<eos>", "<|user|>", "<|assistant|>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|user|>{{ m['content'] }}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def save_char_tokenizer(path: Path, chat_template: str | None = None) -> int:
    """Write a character-level tokenizer (one token per character); returns the vocab size."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {t: i for i, t in enumerate(SPECIALS + CHARS)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>", pad_token="<pad>")
    fast.add_special_tokens({"additional_special_tokens": SPECIALS[2:]})
    if chat_template is not None:
        fast.chat_template = chat_template
    fast.save_pretrained(str(path))
    return len(vocab)


def _init_weights(model, key: int, scale: float):
    params = tree_flatten(model.parameters())
    new = []
    for i, (name, p) in enumerate(params):
        if "norm" in name:
            new.append((name, mx.ones(p.shape, dtype=p.dtype)))
        else:
            r = mx.random.normal(p.shape, key=mx.random.key(key * 1000 + i)) * scale
            new.append((name, r.astype(p.dtype)))
    model.update(tree_unflatten(new))
    mx.eval(model.parameters())


# What each family adds to the common configuration, at test size. Mixture-of-experts
# families get 4 experts, 2 per token; sliding-window families a window of 8 tokens, so a
# prompt of a dozen tokens crosses it and decoding wraps a rotating cache several times.
FAMILIES = {
    "qwen2": {"tie_word_embeddings": True},
    "llama": {},
    "qwen3": {"tie_word_embeddings": True},  # q/k norms; head_dim = hidden // heads
    "phi3": {},  # fused qkv and gate/up projections
    "qwen3_moe": {
        "head_dim": 64,
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "moe_intermediate_size": 64,
        "norm_topk_prob": True,
    },
    "mixtral": {"num_local_experts": 4, "num_experts_per_tok": 2},
    "gpt_oss": {
        "head_dim": 64,
        "num_local_experts": 4,
        "num_experts_per_tok": 2,
        "sliding_window": 8,
        "layer_types": ["sliding_attention", "full_attention"],
    },
    "gemma2": {"head_dim": 64, "query_pre_attn_scalar": 64},
    "gemma3_text": {
        "head_dim": 64,
        "query_pre_attn_scalar": 64,
        "sliding_window": 8,
        "sliding_window_pattern": 2,
    },
}


def build_model(
    path: Path,
    arch: str = "qwen2",
    *,
    hidden: int = 128,
    layers: int = 2,
    heads: int = 2,
    kv_heads: int = 1,
    key: int = 0,
    scale: float = 0.35,
    dtype: str = "float32",
    chat_template: str | None = None,
    context: int = 2048,
    quantize: int | None = None,
    **overrides,
) -> Path:
    """Build a random-weight `arch` (a key of FAMILIES) model directory at `path`.

    The default head size is 64, which the CUDA backend's invariant attention takes (it
    refuses head sizes outside 64/80/96/128 in strict mode), so the same tests run there.
    `context` is the config's max_position_embeddings (RoPE itself has no limit);
    `quantize` (bits) stores an affine-quantized copy (group size 32); `overrides` replace
    configuration keys (e.g. a layer_types list for more layers).
    """
    import importlib

    import mlx.nn as nn
    from mlx_lm.utils import save_config, save_model

    if arch not in FAMILIES:
        raise ValueError(f"unknown arch {arch!r}; expected one of {', '.join(FAMILIES)}")

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    vocab = save_char_tokenizer(path, chat_template)
    config = {
        "model_type": arch,
        "hidden_size": hidden,
        "num_hidden_layers": layers,
        "intermediate_size": 2 * hidden,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "rms_norm_eps": 1e-6,
        "vocab_size": vocab,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
        "max_position_embeddings": context,
        "eos_token_id": SPECIALS.index("<eos>"),
        "torch_dtype": dtype,
        **FAMILIES[arch],
        **overrides,
    }
    if arch == "qwen3":
        config.setdefault("head_dim", hidden // heads)
    family = importlib.import_module(f"mlx_lm.models.{arch}")
    model = family.Model(family.ModelArgs.from_dict(config))
    _init_weights(model, key, scale)
    if dtype != "float32":
        model.set_dtype(getattr(mx, dtype))
    if quantize:
        nn.quantize(model, group_size=32, bits=quantize)
        config["quantization"] = {"group_size": 32, "bits": quantize}
    save_model(path, model)
    save_config(dict(config), path / "config.json")
    return path


def write_jsonl(path: Path, rows) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path
