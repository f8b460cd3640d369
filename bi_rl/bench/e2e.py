"""End-to-end benchmarks: rollout and rescoring with the mode on vs off, same model, same run.

Model: a random-weight Qwen2 shaped like Qwen2-0.5B (hidden 896, 24 layers, 14 query / 2 KV
heads, intermediate 4864, vocab 151936, q/k/v bias, tied embeddings) in bfloat16, and its
4-bit (group 64) copy; `quick` uses a small Qwen2 so a CPU finishes in seconds.

For each batch size B the engine generates B samples of `new` tokens from B random prompts
of `prompt_len` tokens, stop tokens off, once with max_tokens = 1 (prefill plus one decode
step) and once with max_tokens = new: decode tokens/s = B (new - 1) / (t_new - t_1) and
prefill tokens/s = B (prompt_len - 1) / (t_1 - one decode step). Rescoring scores the
generated sequences in full forward passes. The mode ("strict") and stock MLX ("off")
alternate after a warm-up of each, each measured `repeats` times; medians are reported.
The logging share is the time to fingerprint every logits row on the device (launched and
synchronized on its own, so an upper bound: the engine evaluates it together with the
sampled token) plus to hash-chain and write every record, over the rollout's wall time.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn

from bi_rl.logprobs import row_fingerprints
from bi_rl.model import environment
from bi_rl.rollout.engine import Engine, EngineConfig
from bi_rl.rollout.log import LogWriter
from bi_rl.rollout.prompts import Prompt
from bi_rl.rollout.sampler import SamplerConfig
from bi_rl.rollout.schema import RunHeader, RunSettings
from bi_rl.score.scorer import Item, ScoreConfig, score

QWEN2_05B = dict(
    hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
    intermediate_size=4864, vocab_size=151936, tie_word_embeddings=True,
)  # fmt: skip
SMALL = dict(
    hidden_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
    intermediate_size=256, vocab_size=1024, tie_word_embeddings=True,
)  # fmt: skip
MODES = ("strict", "off")


def build_model(shape: dict, bits: int | None, seed: int = 0):
    from mlx_lm.models import qwen2

    mx.random.seed(seed)
    args = qwen2.ModelArgs(model_type="qwen2", rms_norm_eps=1e-6, rope_theta=1e6, **shape)
    model = qwen2.Model(args)
    model.set_dtype(mx.bfloat16)
    if bits:
        nn.quantize(model, group_size=64, bits=bits)
    mx.eval(model.parameters())
    return model


def make_prompts(b: int, length: int, vocab: int, seed: int) -> list[Prompt]:
    ids = mx.random.randint(1, vocab, (b, length), key=mx.random.key(seed)).tolist()
    return [Prompt(id=f"bench-{seed}-{i}", tokens=tuple(row)) for i, row in enumerate(ids)]


def _rollout(model, prompts, mode: str, new: int):
    cfg = EngineConfig(max_tokens=new, stop_tokens=(), batch_size=len(prompts), mode=mode)
    engine = Engine(model, None, SamplerConfig(temperature=1.0, seed=0), cfg)
    start = time.perf_counter()
    samples = [s for step in engine.generate(prompts) for s in step.ready]
    return time.perf_counter() - start, samples


def _median_by_mode(fn: Callable[[str], float], repeats: int) -> dict[str, float]:
    times = {m: [] for m in MODES}
    for _ in range(repeats):
        for m in MODES:  # alternate, so drift hits both sides alike
            times[m].append(fn(m))
    out = {m: statistics.median(t) for m, t in times.items()}
    # (max - min) / median of the noisier side: how far apart repeats of one measurement fell
    out["spread"] = max((max(t) - min(t)) / statistics.median(t) for t in times.values())
    return out


def _logging_seconds(model, prompts, samples, steps: int) -> float:
    """Fingerprint one logits row per sequence per step, then hash-chain and write the log."""
    logits = model(mx.array([list(p.tokens[-1:]) for p in prompts]))[:, -1, :]
    mx.eval(logits)
    start = time.perf_counter()
    for _ in range(steps):
        mx.eval(row_fingerprints(logits))
    fp = time.perf_counter() - start
    settings = RunSettings(
        model_digest="bench",
        tokenizer_digest="bench",
        sampler=SamplerConfig(),
        n=1,
        max_tokens=steps,
        stop_tokens=(),
        stop_strings=(),
        prompt_count=len(prompts),
        prompts_digest="bench",
    )
    header = RunHeader(settings, environment("bench", "strict"))
    with tempfile.TemporaryDirectory() as d:
        start = time.perf_counter()
        with LogWriter(Path(d) / "bench.jsonl", header) as w:
            w.write(samples)
        return fp + time.perf_counter() - start


def run_model(label, model, batches, prompt_len, new, repeats, progress=None) -> list[dict]:
    rows = []
    vocab = model.args.vocab_size
    for b in batches:
        prompts = make_prompts(b, prompt_len, vocab, seed=b)
        for m in MODES:  # warm-up: compile kernels, size caches
            _rollout(model, prompts, m, 2)
        t1 = _median_by_mode(lambda m, p=prompts: _rollout(model, p, m, 1)[0], repeats)
        tn = _median_by_mode(lambda m, p=prompts: _rollout(model, p, m, new)[0], repeats)
        _, samples = _rollout(model, prompts, "strict", new)
        items = [
            Item(tuple(p.tokens), tuple(s.tokens)) for p, s in zip(prompts, samples, strict=True)
        ]

        def rescore(m, it=items, b=b):
            return _timed(lambda: score(model, it, ScoreConfig(batch_size=b, mode=m)))

        for m in MODES:  # warm-up: the first pass of each mode builds kernels / cuDNN plans
            rescore(m)
        ts = _median_by_mode(rescore, repeats)
        row = {"model": label, "batch": b, "prompt_len": prompt_len, "new_tokens": new}
        for m in MODES:
            step = (tn[m] - t1[m]) / (new - 1)
            row[f"decode_tok_s_{m}"] = b * (new - 1) / (tn[m] - t1[m])
            row[f"prefill_tok_s_{m}"] = b * (prompt_len - 1) / max(t1[m] - step, 1e-9)
            row[f"rescore_tok_s_{m}"] = b * (prompt_len + new) / ts[m]
        for k in ("decode", "prefill", "rescore"):
            row[f"{k}_ratio"] = row[f"{k}_tok_s_strict"] / row[f"{k}_tok_s_off"]
        row["logging_share"] = _logging_seconds(model, prompts, samples, new) / tn["strict"]
        row["spread"] = max(t1["spread"], tn["spread"], ts["spread"])
        if progress:
            progress(f"{label} B={b}: decode x{row['decode_ratio']:.2f}")
        rows.append(row)
    return rows


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def run(quick: bool, progress=None, repeats: int | None = None) -> list[dict]:
    shape = SMALL if quick else QWEN2_05B
    batches = (1, 8) if quick else (1, 8, 32, 64)
    prompt_len, new, default_repeats = (32, 8, 3) if quick else (64, 32, 3)
    repeats = repeats or default_repeats
    rows = []
    for label, bits in (("bf16", None), ("4-bit", 4)):
        model = build_model(shape, bits)
        rows += run_model(label, model, batches, prompt_len, new, repeats, progress)
        del model
        mx.clear_cache()
    return rows
