# Rescoring a 4-bit 1.7B-shaped model at batch 64 failed in run e2 (cudaGraphAddKernelNode:
# invalid argument). This finds where: score() at batches 16 / 32 / 64 in each mode, then for a
# failing case the model's layers one by one (evaluated after each) on the same tokens.
import sys
from pathlib import Path

import mlx.core as mx

from bi_rl.bench.e2e import make_prompts
from bi_rl.mode import named_mode
from bi_rl.model import load_model
from bi_rl.score.scorer import Item, ScoreConfig, score

model = load_model(Path(sys.argv[1]))[0]
vocab = 151936
prompts = make_prompts(64, (150, 350), vocab, seed=64)
comp = mx.random.randint(3, vocab, (64, 256), key=mx.random.key(5)).tolist()
items = [Item(p.tokens, tuple(c)) for p, c in zip(prompts, comp, strict=True)]
fails = []
for b in (16, 32, 64):
    for m in ("off", "strict"):
        try:
            score(model, items[:b], ScoreConfig(batch_size=b, mode=m))
            print(f"score B={b} {m}: ok", flush=True)
        except RuntimeError as e:
            print(f"score B={b} {m}: {e}", flush=True)
            fails.append((b, m))
for b, m in fails[:1]:
    n = max(len(it.prompt) + len(it.completion) for it in items[:b])
    x = mx.random.randint(3, vocab, (b, n), key=mx.random.key(1))
    with named_mode(m):
        h = model.model.embed_tokens(x)
        mx.eval(h)
        print("embed ok", h.shape, flush=True)
        for i, layer in enumerate(model.model.layers[:2]):
            a = layer.input_layernorm(h)
            for name in ("q_proj", "k_proj", "v_proj"):
                try:
                    mx.eval(getattr(layer.self_attn, name)(a))
                    print(f"layer {i} {name} ok", flush=True)
                except RuntimeError as e:
                    print(f"layer {i} {name}: {e}", flush=True)
            try:
                mx.eval(layer.self_attn(a, mask="causal"))
                print(f"layer {i} attention ok", flush=True)
            except RuntimeError as e:
                print(f"layer {i} attention: {e}", flush=True)
            a = layer.post_attention_layernorm(h)
            for name in ("gate_proj", "up_proj"):
                try:
                    mx.eval(getattr(layer.mlp, name)(a))
                    print(f"layer {i} {name} ok", flush=True)
                except RuntimeError as e:
                    print(f"layer {i} {name}: {e}", flush=True)
            try:
                mx.eval(layer.mlp(a))
                print(f"layer {i} mlp ok", flush=True)
            except RuntimeError as e:
                print(f"layer {i} mlp: {e}", flush=True)
        h = model.model.norm(h)
        try:
            mx.eval(model.model.embed_tokens.as_linear(h[:, -300:]))
            print("head ok", flush=True)
        except RuntimeError as e:
            print(f"head: {e}", flush=True)
