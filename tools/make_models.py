"""Write random-weight mlx-lm models of several families at real widths, offline.

    python tools/make_models.py OUT                       # every model below, under OUT/NAME
    python tools/make_models.py OUT gpt_oss-bf16 gemma2-q4 --layers 4
    python tools/make_models.py OUT --small               # CPU-sized, same layouts
    python tools/make_models.py --list

Each family keeps its published widths (hidden size, heads, head dim, experts, sliding
window, vocabulary) with only a few layers, so `bi-verify --model OUT/NAME` runs the
round trip (rollout at batch 8, rescoring at batch 3 shuffled, stock control) at the shapes
the kernels meet in real use. `-q4` copies are affine 4-bit (group 64; gpt-oss ships its
experts in mxfp4, which bi-rl refuses in strict mode). Weights are a pure function of
--seed (explicit keys, uniform in +-1/sqrt(fan-in)); the tokenizer is the embedded adder's
(ids 0-15; the models' vocabularies are larger, as bi-verify --model samples ids directly).

  name            widths of                       what it exercises
  qwen3_moe       Qwen3-30B-A3B                   128 experts, 8 per token (gather_mm/qmm)
  mixtral         Mixtral-8x7B                    8 experts, 2 per token
  gpt_oss         gpt-oss-20b                     32 experts with biases, sinks, window 128
  gemma2          Gemma-2-2B                      attention by hand (soft-cap), head dim 256
  gemma3_text     Gemma-3-1B (head dim 256)       sliding window 512 and global layers
  gemma3_text-hd128  the same, head dim 128       the cache handling, before head dim 256
"""

from __future__ import annotations

import argparse
import importlib
import shutil
from pathlib import Path

# name -> (family, configuration). num_hidden_layers comes from --layers.
FAMILIES = {
    "qwen3_moe": (
        "qwen3_moe",
        dict(
            hidden_size=2048, num_attention_heads=32, num_key_value_heads=4, head_dim=128,
            intermediate_size=6144, moe_intermediate_size=768, num_experts=128,
            num_experts_per_tok=8, decoder_sparse_step=1, mlp_only_layers=[],
            norm_topk_prob=True, vocab_size=151936, rope_theta=1000000.0,
            tie_word_embeddings=False, max_position_embeddings=40960, rms_norm_eps=1e-6,
        ),
    ),
    "mixtral": (
        "mixtral",
        dict(
            hidden_size=4096, num_attention_heads=32, num_key_value_heads=8,
            intermediate_size=14336, num_local_experts=8, num_experts_per_tok=2,
            vocab_size=32000, rope_theta=1000000.0, rms_norm_eps=1e-5,
        ),
    ),
    "gpt_oss": (
        "gpt_oss",
        dict(
            hidden_size=2880, num_attention_heads=64, num_key_value_heads=8, head_dim=64,
            intermediate_size=2880, num_local_experts=32, num_experts_per_tok=4,
            sliding_window=128, vocab_size=201088, rope_theta=150000, rms_norm_eps=1e-5,
        ),
    ),
    "gemma2": (
        "gemma2",
        dict(
            hidden_size=2304, num_attention_heads=8, num_key_value_heads=4, head_dim=256,
            intermediate_size=9216, vocab_size=256000, query_pre_attn_scalar=256,
            attn_logit_softcapping=50.0, final_logit_softcapping=30.0, rms_norm_eps=1e-6,
            rope_theta=10000.0,
        ),
    ),
    "gemma3_text": (
        "gemma3_text",
        dict(
            hidden_size=1152, num_attention_heads=4, num_key_value_heads=1, head_dim=256,
            intermediate_size=6912, vocab_size=262144, query_pre_attn_scalar=256,
            sliding_window=512, sliding_window_pattern=2, rope_theta=1000000.0,
            rope_local_base_freq=10000.0, rms_norm_eps=1e-6,
        ),
    ),
}  # fmt: skip
FAMILIES["gemma3_text-hd128"] = (
    "gemma3_text",
    {**FAMILIES["gemma3_text"][1], "head_dim": 128, "query_pre_attn_scalar": 128},
)
SMALL = dict(hidden_size=256, vocab_size=2048, intermediate_size=512)
SMALL_MOE = dict(moe_intermediate_size=128, num_experts=8, num_local_experts=8)
DEFAULT_NAMES = [f"{n}-{v}" for n in FAMILIES for v in ("bf16", "q4")]


def config_for(name: str, layers: int, small: bool) -> tuple[str, dict]:
    family, cfg = FAMILIES[name]
    cfg = {"model_type": family, **cfg, "num_hidden_layers": layers, "eos_token_id": 2}
    if family == "gpt_oss":
        cfg["layer_types"] = ["sliding_attention", "full_attention"] * (layers // 2) + [
            "sliding_attention"
        ] * (layers % 2)
    if small:
        cfg.update({k: v for k, v in SMALL.items() if k in cfg})
        cfg.update({k: v for k, v in SMALL_MOE.items() if k in cfg})
        if "num_experts_per_tok" in cfg:
            cfg["num_experts_per_tok"] = min(cfg["num_experts_per_tok"], 4)
        heads = cfg["hidden_size"] // 64  # head dim 64, grouped-query heads
        cfg.update(num_attention_heads=heads, num_key_value_heads=min(2, heads // 2))
        for key in ("head_dim", "query_pre_attn_scalar"):
            if key in cfg:
                cfg[key] = 64
        if "sliding_window" in cfg:
            cfg["sliding_window"] = min(cfg["sliding_window"], 32)
    return family, cfg


def init_weights(model, seed: int) -> None:
    """Every matrix uniform in +-1/sqrt(fan-in) from its own key; vectors (norms, biases,
    sinks) keep the family's own deterministic initial values."""
    import mlx.core as mx
    from mlx.utils import tree_flatten, tree_unflatten

    new = []
    for i, (name, p) in enumerate(tree_flatten(model.parameters())):
        if p.ndim >= 2:
            bound = p.shape[-1] ** -0.5
            key = mx.random.key(seed * 1_000_003 + i)
            p = mx.random.uniform(-bound, bound, p.shape, key=key)
        new.append((name, p))
    model.update(tree_unflatten(new))


def write_model(path: Path, name: str, bits: int | None, layers: int, seed: int, small: bool):
    import mlx.core as mx
    import mlx.nn as nn
    from mlx_lm.utils import save_config, save_model

    from bi_rl.assets import DEFAULT_MODEL

    family, cfg = config_for(name, layers, small)
    mod = importlib.import_module(f"mlx_lm.models.{family}")
    model = mod.Model(mod.ModelArgs.from_dict(cfg))
    init_weights(model, seed)
    model.set_dtype(mx.bfloat16)
    if bits:
        nn.quantize(model, group_size=64, bits=bits)
        cfg["quantization"] = {"group_size": 64, "bits": bits}
    mx.eval(model.parameters())
    path.mkdir(parents=True, exist_ok=True)
    save_model(path, model)
    save_config(cfg, path / "config.json")
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(DEFAULT_MODEL / f, path / f)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("out", type=Path, nargs="?")
    p.add_argument("names", nargs="*", help=f"models to write (default: all of {DEFAULT_NAMES})")
    p.add_argument("--layers", type=int, default=2, help="layers per model (default 2)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--small", action="store_true", help="CPU-sized widths, same layouts")
    p.add_argument("--list", action="store_true", help="print the model names and exit")
    p.add_argument("--force", action="store_true", help="rewrite models that already exist")
    args = p.parse_args(argv)
    if args.list:
        print("\n".join(DEFAULT_NAMES))
        return
    if args.out is None:
        p.error("OUT is required")
    for full in args.names or DEFAULT_NAMES:
        name, _, variant = full.rpartition("-")
        if name not in FAMILIES or variant not in ("bf16", "q4"):
            p.error(f"unknown model {full!r}; --list shows the names")
        path = args.out / full
        if (path / "config.json").exists() and not args.force:
            print(f"{path}: exists")
            continue
        write_model(path, name, 4 if variant == "q4" else None, args.layers, args.seed, args.small)
        print(f"{path}: written")


if __name__ == "__main__":
    main()
