"""mlx-lm's `batch_generate`, drop-in, on the invariant engine and the keyed sampler.

    from bi_rl import batch_generate          # instead of: from mlx_lm import batch_generate
    r = batch_generate(model, tokenizer, prompts, max_tokens=256, return_token_ids=True,
                       return_logprobs=True, temperature=1.0, seed=0)
    r.texts, r.token_ids, r.logprobs          # an mlx_lm.generate.BatchResponse

The same as mlx-lm's (0.32.2): the parameters, in order, with their defaults (the extra
ones below are keyword-only); the result, mlx-lm's own `BatchResponse` and `BatchStats`;
greedy decoding unless a temperature is given; stopping on `tokenizer.eos_token_ids`; and
mlx-lm's stop-token rule: a sequence that ends on a stop token leaves that token out of
`texts`, `token_ids` and `logprobs`, while a sequence cut at `max_tokens` keeps its last
token (a stop token drawn at the last allowed position counts as a stop and is left out).

What differs, and why:
  - Sampling is keyed. Settings are keyword arguments (temperature, top_p, top_k, min_p,
    seed; bi_rl.rollout.sampler defines them); the token at completion position t of prompt
    i is a pure function of that row's logits and (seed, prompt id, 0, t), whatever else is
    in the batch. Prompt ids are str(i), the prompt's index, unless `prompt_ids=` names
    them. An arbitrary `sampler=` callable or `logits_processors=` cannot be keyed that
    way: both are refused with a one-line error saying what to pass instead.
  - Logprobs are float32 log_softmax(logits / T) of the full distribution at the sampling
    temperature (T = 1 when greedy), computed in float32 whatever the model's dtype
    (mlx-lm returns logits - logsumexp(logits) at T = 1 in the model's dtype). They come
    as Python floats holding float32 values exactly: np.float32(x) gives back the bits.
  - Forward passes run inside `batch_invariant_mode` (`mode=`: "strict", "fallback" or
    "off"), so each logprob equals, bit for bit, what a trainer recomputes in a full
    forward pass (bi_rl.score.policy) and what `bi-rescore` recomputes from the log.
  - Batching: `completion_batch_size` is the decode batch, `prefill_step_size` the prefill
    chunk; `prefill_batch_size` is accepted and has no effect (waiting prompts join
    whenever decode slots are free). None of them changes a single bit of the result.
  - Refused with a one-line error: `prompt_caches`, `return_prompt_caches`, `max_kv_size`,
    `stream`, and models whose caches are not standard KV caches.
  - `stats.prompt_time` stays 0: prefill runs inside engine steps, timed in `decode_time`.
  - `log=PATH` writes the hash-chained rollout log (bi_rl/rollout/schema.py, the format
    `bi-rollout` writes, so `bi-audit` and `bi-rescore` read it) and its sidecar. The
    header records the digests of `model_path=`, the directory the model was loaded from;
    a model carrying LoRA adapters is refused there (its weights are not that directory's).

`generate_samples` is the same engine run returning the engine's samples (stop token and
its logprob included, as the log records them): what a trainer needs.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import mlx.core as mx

from bi_rl.mode import DEFAULT_MODE
from bi_rl.model import environment, resolve_model
from bi_rl.rollout.engine import Engine, EngineConfig, Sample, Step
from bi_rl.rollout.log import LogWriter
from bi_rl.rollout.prompts import Prompt
from bi_rl.rollout.run import run_settings, run_summary
from bi_rl.rollout.sampler import (
    DEFAULT_MIN_P,
    DEFAULT_SEED,
    DEFAULT_TOP_K,
    DEFAULT_TOP_P,
    SamplerConfig,
)
from bi_rl.rollout.schema import RunHeader, Sidecar

__all__ = ["GenerateError", "batch_generate", "generate_samples", "has_adapters"]

# mlx-lm's defaults, so a call that relies on them behaves the same.
DEFAULT_MAX_TOKENS = 128
DEFAULT_TEMP = 0.0  # mlx_lm.generate.DEFAULT_TEMP: greedy unless a temperature is given
DEFAULT_COMPLETION_BATCH_SIZE = 32
DEFAULT_PREFILL_BATCH_SIZE = 8
DEFAULT_PREFILL_STEP_SIZE = 2048
ADAPTER_LEAVES = ("lora_a", "lora_b")  # mlx_lm.tuner's LoRA parameters

_KEYED = "temperature=, top_p=, top_k=, min_p= and seed="


class GenerateError(ValueError):
    """An argument batch_generate cannot honour; the message names it and what to pass."""


def has_adapters(model) -> bool:
    """Whether the model carries LoRA layers (parameters named lora_a / lora_b)."""
    from mlx.utils import tree_flatten

    return any(k.rsplit(".", 1)[-1] in ADAPTER_LEAVES for k, _ in tree_flatten(model.parameters()))


def _check_prompts(prompts, prompt_ids) -> list[Prompt]:
    if isinstance(prompts, (str, bytes)) or not isinstance(prompts, Sequence) or not prompts:
        raise GenerateError("prompts must be a non-empty list of token id lists")
    ids = [str(i) for i in range(len(prompts))] if prompt_ids is None else list(prompt_ids)
    if len(ids) != len(prompts):
        raise GenerateError(f"{len(ids)} prompt_ids for {len(prompts)} prompts")
    if len(set(ids)) != len(ids):
        raise GenerateError("prompt_ids must be unique: they key each prompt's sampling")
    out = []
    for i, (pid, p) in enumerate(zip(ids, prompts, strict=True)):
        if isinstance(p, str) or not all(type(t) is int and t >= 0 for t in p):
            raise GenerateError(
                f"prompt {i} is not a list of token ids (encode text with tokenizer.encode)"
            )
        if not p:
            raise GenerateError(f"prompt {i} has no tokens")
        out.append(Prompt(id=str(pid), tokens=tuple(p)))
    return out


def _check_max_tokens(max_tokens, count: int) -> list[int]:
    limits = [max_tokens] * count if isinstance(max_tokens, int) else list(max_tokens)
    if len(limits) != count:
        raise GenerateError(f"{len(limits)} max_tokens values for {count} prompts")
    if not all(type(m) is int and m >= 1 for m in limits):
        raise GenerateError("max_tokens must be an integer >= 1 (or one per prompt)")
    return limits


def _refuse(**given) -> None:
    """One-line errors for mlx-lm arguments this engine cannot honour."""
    what = {
        "sampler": f"a sampler callable cannot be keyed per sequence; pass {_KEYED} instead",
        "logits_processors": "logits processors cannot be replayed by a trainer or bi-rescore; "
        f"leave them out and pass {_KEYED}",
        "prompt_caches": "precomputed prompt caches are not supported; pass the full prompts",
        "return_prompt_caches": "prompt caches are not returned; leave it False",
        "max_kv_size": "rotating KV caches are not supported; leave max_kv_size None",
        "stream": "generation runs on the default stream; leave stream None",
    }
    for name, value in given.items():
        if value not in (None, False):
            raise GenerateError(f"batch_generate: {name}= is not supported: {what[name]}")


def _open_log(log, model, model_path, engine: Engine, prompts: list[Prompt]) -> LogWriter:
    """Validate everything the log depends on, then create it (never over an existing file)."""
    if model_path is None:
        raise GenerateError(
            "log= needs model_path=, the directory the model was loaded from (the log records "
            "its digests so bi-rescore and bi-audit can check the model)"
        )
    path, name = resolve_model(str(model_path))
    if has_adapters(model):
        raise GenerateError(
            f"log= records the digests of {name}, but this model carries LoRA adapters (its "
            "weights are not that directory's); fuse and save it first, or leave log= out"
        )
    out = Path(log)
    if out.exists():
        raise GenerateError(
            f"log {str(out)!r} already exists; logs are append-only: choose another path"
        )
    if not out.parent.is_dir() or not os.access(out.parent, os.W_OK):
        raise GenerateError(f"log directory {str(out.parent)!r} does not exist or is not writable")
    header = RunHeader(run_settings(path, engine, prompts), environment(name, engine.config.mode))
    return LogWriter(out, header)


def generate_samples(
    model,
    tokenizer,
    prompts: Sequence[Prompt],
    sampler: SamplerConfig,
    config: EngineConfig,
    *,
    log=None,
    model_path=None,
    progress: Callable[[Step, int, int], None] | None = None,
) -> tuple[list[Sample], dict]:
    """Run the engine over `prompts`: (samples in canonical order, counts and timings).

    The sampler's settings and seed key every token. Samples keep the stop token and its
    logprob (as the log does). With `log`, the samples are also written to a new rollout log
    at that path, with its sidecar.
    """
    engine = Engine(model, tokenizer, sampler, config)
    writer = _open_log(log, model, model_path, engine, list(prompts)) if log else None
    samples: list[Sample] = []
    total = len(prompts) * config.n
    counts = {"generated": 0, "prefilled": 0, "steps": 0}
    t0 = time.perf_counter()
    try:
        for step in engine.generate(prompts):
            samples.extend(step.ready)
            if writer is not None:
                writer.write(step.ready)
            counts["generated"] += step.generated
            counts["prefilled"] += step.prefilled
            counts["steps"] += 1
            if progress is not None:
                progress(step, len(samples), total)
    finally:
        if writer is not None:
            writer.close()
    counts["seconds"] = time.perf_counter() - t0
    if writer is not None:
        summary = run_summary(
            writer.path,
            writer.count,
            None,
            counts["generated"],
            counts["prefilled"],
            counts["seconds"],
            config,
        )
        Sidecar((summary,)).write(writer.path)
    return samples, counts


def batch_generate(
    model,
    tokenizer,
    prompts,
    prompt_caches=None,
    max_tokens=DEFAULT_MAX_TOKENS,
    verbose: bool = False,
    return_prompt_caches: bool = False,
    return_token_ids: bool = False,
    return_logprobs: bool = False,
    *,
    temperature: float = DEFAULT_TEMP,
    top_p: float = DEFAULT_TOP_P,
    top_k: int = DEFAULT_TOP_K,
    min_p: float = DEFAULT_MIN_P,
    seed: int = DEFAULT_SEED,
    prompt_ids: Sequence[str] | None = None,
    mode: str = DEFAULT_MODE,
    log=None,
    model_path=None,
    sampler=None,
    logits_processors=None,
    completion_batch_size: int = DEFAULT_COMPLETION_BATCH_SIZE,
    prefill_batch_size: int = DEFAULT_PREFILL_BATCH_SIZE,
    prefill_step_size: int = DEFAULT_PREFILL_STEP_SIZE,
    max_kv_size=None,
    stream=None,
    **kwargs,
):
    """Generate one completion per prompt: mlx-lm's call, bi-rl's engine (module doc).

    prompts: token id lists. max_tokens: an int or one per prompt. Returns
    mlx_lm.generate.BatchResponse(texts, stats, caches=None, token_ids, logprobs).
    """
    from mlx_lm.generate import BatchResponse, BatchStats

    if kwargs:
        raise TypeError(f"batch_generate() got unexpected keyword argument(s) {', '.join(kwargs)}")
    _refuse(
        sampler=sampler,
        logits_processors=logits_processors,
        prompt_caches=prompt_caches,
        return_prompt_caches=return_prompt_caches,
        max_kv_size=max_kv_size,
        stream=stream,
    )
    if type(prefill_batch_size) is not int or prefill_batch_size < 1:
        raise GenerateError(f"prefill_batch_size must be >= 1, got {prefill_batch_size!r}")
    items = _check_prompts(prompts, prompt_ids)
    limits = _check_max_tokens(max_tokens, len(items))
    if log is not None and len(set(limits)) > 1:
        raise GenerateError("log= records one max_tokens for the run; pass a single value")
    try:
        smp = SamplerConfig(temperature, top_p, top_k, min_p, seed)
        cfg = EngineConfig(
            max_tokens=max(limits),
            stop_tokens=tuple(sorted(tokenizer.eos_token_ids)),
            batch_size=completion_batch_size,
            prefill_chunk=prefill_step_size,
            mode=mode,
        )
    except ValueError as e:
        raise GenerateError(f"batch_generate: {e}") from None

    def progress(step, done, total):
        if verbose:
            print(f"[batch_generate] Finished processing {done}/{total} ...", end="\r")

    samples, counts = generate_samples(
        model, tokenizer, items, smp, cfg, log=log, model_path=model_path, progress=progress
    )
    tokens, lps = [], []
    for s, limit in zip(samples, limits, strict=True):
        # mlx-lm's rule: the stop token that ended a sequence is not part of its output.
        keep = min(limit, len(s.tokens) - (s.finish == "stop" and isinstance(s.stop, int)))
        tokens.append(list(s.tokens[:keep]))
        lps.append([float(x) for x in s.logprobs[:keep]])
    stats = BatchStats(
        prompt_tokens=sum(len(p.tokens) for p in items),
        generation_tokens=counts["generated"],
        generation_steps=counts["steps"],
        decode_time=counts["seconds"],
        wall_time=counts["seconds"],
        peak_memory=mx.get_peak_memory() / 1e9,
    )
    if verbose:
        print(f"[batch_generate] Finished processing {len(samples)}/{len(samples)}")
        print(
            f"[batch_generate] Generation: {stats.generation_tokens} tokens, "
            f"{stats.generation_tps:.3f} tokens-per-sec",
            file=sys.stdout,
        )
    return BatchResponse(
        texts=[tokenizer.decode(t) for t in tokens],
        stats=stats,
        caches=None,
        token_ids=tokens if return_token_ids else None,
        logprobs=lps if return_logprobs else None,
    )
