"""Write a random-weight Qwen2 shaped like Qwen2-0.5B as an mlx-lm model directory, offline.

    python tools/make_qwen2_05b.py OUT            # OUT/bf16, OUT/q4 (4-bit, group 64),
                                                     # OUT/prompts.jsonl
    python tools/make_qwen2_05b.py OUT --small    # a tiny copy of the same layout, for a CPU

Shape: hidden 896, 24 layers, 14 query / 2 KV heads, intermediate 4864, vocab 151936, q/k/v
bias, tied embeddings, bfloat16. Prompts are digit strings for the embedded adder's
character tokenizer, so bi-rollout and bi-rescore run on it unchanged.
This is the model the H200 round trip (bi-rollout then bi-rescore) uses: no hub, no download.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn

SHAPE = dict(
    hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
    intermediate_size=4864, vocab_size=151936,
)  # fmt: skip
SMALL = dict(
    hidden_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
    intermediate_size=256, vocab_size=2048,
)  # fmt: skip


def write_tokenizer(path: Path) -> None:
    """The embedded adder's character tokenizer (ids 0-15; <eos> is 2). The model's vocabulary
    is larger than the tokenizer's, as Qwen2's own is: sampled ids need no text to be logged,
    rescored and audited."""
    from bi_rl.assets import DEFAULT_MODEL

    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(DEFAULT_MODEL / name, path / name)


def write_model(path: Path, shape: dict, bits: int | None, seed: int) -> None:
    from mlx_lm.models import qwen2
    from mlx_lm.utils import save_config, save_model

    config = {
        "model_type": "qwen2",
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "tie_word_embeddings": True,
        "max_position_embeddings": 32768,
        "eos_token_id": 2,
        **shape,
    }
    mx.random.seed(seed)
    model = qwen2.Model(qwen2.ModelArgs.from_dict(config))
    model.set_dtype(mx.bfloat16)
    if bits:
        nn.quantize(model, group_size=64, bits=bits)
        config["quantization"] = {"group_size": 64, "bits": bits}
    mx.eval(model.parameters())
    save_model(path, model)
    save_config(config, path / "config.json")
    write_tokenizer(path)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", type=Path)
    p.add_argument("--small", action="store_true", help="tiny shape, same layout (CPU tests)")
    p.add_argument("--prompts", type=int, default=8, help="prompts to write (default 8)")
    args = p.parse_args(argv)
    shape = SMALL if args.small else SHAPE
    for name, bits in (("bf16", None), ("q4", 4)):
        write_model(args.out / name, shape, bits, seed=0)
    digits = mx.random.randint(0, 10, (args.prompts, 64), key=mx.random.key(1)).tolist()
    with open(args.out / "prompts.jsonl", "w") as f:
        for i, row in enumerate(digits):
            text = "".join(map(str, row[: 16 + 6 * i]))  # lengths 16, 22, ... differ
            f.write(json.dumps({"id": f"p{i}", "prompt": text}) + "\n")
    print(f"wrote {args.out}/bf16, {args.out}/q4 and {args.out}/prompts.jsonl")


if __name__ == "__main__":
    main()
