"""End to end on one backend: batched greedy rollouts vs single-prompt runs vs one-shot rescoring.

A random-weight Qwen2 shaped like Qwen2-0.5B (hidden 896, 24 layers, 14 heads / 2 KV heads,
intermediate 4864, vocab 151936, q/k/v bias, tied embeddings), in bfloat16 and as a 4-bit
copy. For 8 prompts of different lengths it generates greedily (a) each prompt alone with
mlx-lm's KVCache, (b) all 8 in one left-padded batch with BatchKVCache, then (c) rescores
every batched rollout in one right-padded forward pass, and compares the float32 logprob of
every generated token bit for bit: alone vs batch, and rollout vs rescoring. Run inside
`bi_rl.batch_invariant_mode()` and as stock MLX (the control).

    python tools/cuda_e2e.py                       # H200: the 0.5B shape
    python tools/cuda_e2e.py --layers 2 --vocab 512 --new-tokens 8   # a quick CPU run

Weights come from keyed draws (no global random state); nothing is downloaded.
"""

from __future__ import annotations

import argparse
import sys
import time

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import orjson
from mlx.utils import tree_flatten, tree_unflatten
from mlx_lm.models import qwen2
from mlx_lm.models.cache import BatchKVCache, make_prompt_cache

import bi_rl


def build_model(layers: int, vocab: int, bits: int | None, seed: int):
    args = qwen2.ModelArgs(
        model_type="qwen2",
        hidden_size=896,
        num_hidden_layers=layers,
        intermediate_size=4864,
        num_attention_heads=14,
        rms_norm_eps=1e-6,
        vocab_size=vocab,
        num_key_value_heads=2,
        tie_word_embeddings=True,
    )
    model = qwen2.Model(args)
    params = []
    for i, (name, p) in enumerate(tree_flatten(model.parameters())):
        key = mx.random.key(seed * 100003 + i)
        if name.endswith("norm.weight"):
            value = 1.0 + 0.1 * mx.random.normal(p.shape, key=key)
        elif name.endswith("embed_tokens.weight"):
            value = mx.random.normal(p.shape, key=key)
        else:
            fan_in = p.shape[-1] if p.ndim == 2 else 896
            value = mx.random.normal(p.shape, key=key) * fan_in**-0.5
        params.append((name, value.astype(mx.bfloat16)))
    model.update(tree_unflatten(params))
    if bits:
        nn.quantize(model, group_size=64, bits=bits)
    mx.eval(model.parameters())
    return model


def logprob_of(logits: mx.array, tokens: mx.array) -> mx.array:
    """float32 log-softmax of each row at its token: the one definition both sides use."""
    lf = logits.astype(mx.float32)
    lp = lf - mx.logsumexp(lf, axis=-1, keepdims=True)
    return mx.take_along_axis(lp, tokens[:, None], axis=-1)[:, 0]


def generate_alone(model, prompt: list[int], n: int):
    cache = make_prompt_cache(model)
    logits = model(mx.array(prompt)[None], cache=cache)[:, -1]
    toks, lps = [], []
    for _ in range(n):
        t = mx.argmax(logits, axis=-1)
        toks.append(t)
        lps.append(logprob_of(logits, t))
        logits = model(t[:, None], cache=cache)[:, -1]
    mx.eval(toks, lps)
    return np.array(mx.concatenate(toks)), np.array(mx.concatenate(lps))


def generate_batch(model, prompts: list[list[int]], n: int):
    width = max(len(p) for p in prompts)
    pads = [width - len(p) for p in prompts]
    tokens = mx.array([[0] * pad + p for pad, p in zip(pads, prompts, strict=True)])
    cache = [BatchKVCache(pads) for _ in model.layers]
    logits = model(tokens, cache=cache)[:, -1]
    toks, lps = [], []
    for _ in range(n):
        t = mx.argmax(logits, axis=-1)
        toks.append(t)
        lps.append(logprob_of(logits, t))
        logits = model(t[:, None], cache=cache)[:, -1]
    mx.eval(toks, lps)
    return np.stack([np.array(t) for t in toks], 1), np.stack([np.array(x) for x in lps], 1)


def rescore(model, prompts: list[list[int]], completions: np.ndarray):
    """One forward pass over every (prompt + completion), right-padded, causal mask."""
    seqs = [p + c.tolist() for p, c in zip(prompts, completions, strict=True)]
    width = max(len(s) for s in seqs)
    tokens = mx.array([s + [0] * (width - len(s)) for s in seqs])
    logits = model(tokens)
    out = []
    for i, (p, c) in enumerate(zip(prompts, completions, strict=True)):
        rows = logits[i, len(p) - 1 : len(p) - 1 + len(c)]
        out.append(np.array(logprob_of(rows, mx.array(c))))
    return np.stack(out)


def run(model, prompts, n: int) -> dict:
    start = time.perf_counter()
    alone = [generate_alone(model, p, n) for p in prompts]
    alone_tok = np.stack([a[0] for a in alone])
    alone_lp = np.stack([a[1] for a in alone])
    batch_tok, batch_lp = generate_batch(model, prompts, n)
    rescored = rescore(model, prompts, batch_tok)
    bits = lambda x: np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    diverged = [
        int(np.argmax(a != b)) for a, b in zip(alone_tok, batch_tok, strict=True) if (a != b).any()
    ]
    same_tokens = alone_tok == batch_tok  # compare logprobs only where the tokens agree
    return {
        "tokens": int(batch_tok.size),
        "alone_vs_batch_differ": int((bits(alone_lp) != bits(batch_lp))[same_tokens].sum()),
        "alone_vs_batch_compared": int(same_tokens.sum()),
        "greedy_diverged": len(diverged),
        "first_divergence_steps": diverged,
        "rollout_vs_rescore_differ": int((bits(batch_lp) != bits(rescored)).sum()),
        "max_abs_logprob_diff": float(np.abs(batch_lp - rescored).max()),
        "seconds": round(time.perf_counter() - start, 2),
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--layers", type=int, default=24)
    p.add_argument("--vocab", type=int, default=151936)
    p.add_argument("--new-tokens", type=int, default=48)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--variants", default="bf16,q4", help="comma list of bf16, q4")
    p.add_argument("--paths", default="mode,stock", help="comma list of mode, stock")
    p.add_argument("--json", metavar="PATH", help="write the results as JSON")
    args = p.parse_args(argv)
    rng = np.random.default_rng(args.seed)
    lengths = [5, 17, 33, 9, 64, 23, 40, 12]
    prompts = [rng.integers(1, args.vocab, size=n).tolist() for n in lengths]
    results = {"device": str(mx.default_device()), "backend": bi_rl.active_backend().name}
    print(f"backend={results['backend']} mlx={mx.__version__} new_tokens={args.new_tokens}")
    header = f"{'model':<6} {'path':<6} {'alone!=batch':>13} {'diverged':>9} "
    header += f"{'rollout!=rescore':>17} {'s':>6}"
    rows = []
    for variant in args.variants.split(","):
        model = build_model(args.layers, args.vocab, 4 if variant == "q4" else None, args.seed)
        for path in args.paths.split(","):
            if path == "mode":
                with bi_rl.batch_invariant_mode():
                    r = run(model, prompts, args.new_tokens)
            else:
                r = run(model, prompts, args.new_tokens)
            results[f"{variant}/{path}"] = r
            rows.append(
                f"{variant:<6} {path:<6} "
                f"{r['alone_vs_batch_differ']:>6}/{r['alone_vs_batch_compared']:<6} "
                f"{r['greedy_diverged']:>9} {r['rollout_vs_rescore_differ']:>10}/{r['tokens']:<6} "
                f"{r['seconds']:>6}"
            )
            print(rows[-1], flush=True)
        del model
        mx.clear_cache()
    print("\nfloat32 logprob bits of every generated token (count differing / compared)")
    print(header)
    print("\n".join(rows))
    if args.json:
        with open(args.json, "wb") as f:
            f.write(orjson.dumps(results, option=orjson.OPT_INDENT_2))
    ok = all(
        r["alone_vs_batch_differ"] == 0
        and r["greedy_diverged"] == 0
        and r["rollout_vs_rescore_differ"] == 0
        for name, r in results.items()
        if name.endswith("/mode")
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
