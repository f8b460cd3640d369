"""Write a random-weight Qwen3 shaped like Qwen3-1.7B as an mlx-lm model directory, offline.

    python tools/make_qwen3.py OUT                 # OUT/model (bf16), OUT/prompts.jsonl
    python tools/make_qwen3.py OUT --layers 4      # the same widths, fewer blocks
    python tools/make_qwen3.py OUT --small         # a tiny copy of the layout, for a CPU

Shape: hidden 2048, 28 layers, 16 query / 8 KV heads of size 128, intermediate 6144, vocab
151936, q/k RMSNorm, tied embeddings, bfloat16. The tokenizer is the embedded adder's
(character level, <eos> = 2) and the prompts are digit strings, so bi-rollout, bi-rescore
and bi-train run on it unchanged; reward it with examples/rewards.py:even_tokens, which a
random model can learn.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import mlx.core as mx

SHAPE = dict(
    hidden_size=2048,
    num_hidden_layers=28,
    num_attention_heads=16,
    num_key_value_heads=8,
    head_dim=128,
    intermediate_size=6144,
    vocab_size=151936,
)
SMALL = dict(
    hidden_size=128,
    num_hidden_layers=2,
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=64,
    intermediate_size=256,
    vocab_size=2048,
)


def write_model(path: Path, shape: dict, seed: int) -> None:
    from mlx_lm.models import qwen3
    from mlx_lm.utils import save_config, save_model

    from bi_rl.assets import DEFAULT_MODEL

    config = {
        "model_type": "qwen3",
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "tie_word_embeddings": True,
        "max_position_embeddings": 40960,
        "eos_token_id": 2,
        **shape,
    }
    path.mkdir(parents=True, exist_ok=True)
    model = qwen3.Model(qwen3.ModelArgs.from_dict(config))
    params = dict(_flat(model.parameters()))
    for i, name in enumerate(sorted(params)):  # explicit keys: the same bytes on every run
        p = params[name]
        if "norm" in name:
            params[name] = mx.ones(p.shape)
        else:
            params[name] = mx.random.normal(p.shape, key=mx.random.key(seed * 100003 + i)) * 0.02
    model.load_weights(list(params.items()))
    model.set_dtype(mx.bfloat16)
    mx.eval(model.parameters())
    save_model(path, model)
    save_config(config, path / "config.json")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(DEFAULT_MODEL / name, path / name)


def _flat(tree):
    from mlx.utils import tree_flatten

    return tree_flatten(tree)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", type=Path)
    p.add_argument("--small", action="store_true", help="tiny shape, same layout (CPU)")
    p.add_argument("--layers", type=int, help="number of blocks (default: the shape's)")
    p.add_argument("--prompts", type=int, default=16, help="prompts to write (default 16)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    shape = dict(SMALL if args.small else SHAPE)
    if args.layers:
        shape["num_hidden_layers"] = args.layers
    write_model(args.out / "model", shape, args.seed)
    digits = mx.random.randint(0, 10, (args.prompts, 48), key=mx.random.key(1)).tolist()
    with open(args.out / "prompts.jsonl", "w") as f:
        for i, row in enumerate(digits):
            text = "".join(map(str, row[: 8 + (5 * i) % 40]))  # lengths 8..47 differ
            f.write(json.dumps({"id": f"p{i}", "prompt": text}) + "\n")
    print(f"wrote {args.out}/model and {args.out}/prompts.jsonl")


if __name__ == "__main__":
    main()
