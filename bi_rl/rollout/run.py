"""One rollout run end to end: resolve and load the model, read prompts, write the log.

`rollout(config)` is what `bi-rollout` runs, usable from Python as well. It records in the
log header (bi_rl.rollout.schema.RunHeader) the model's and tokenizer's digests, the sampler
settings and seed, and the prompt-set digest (the run section, which seeds the hash chain),
and the package versions, backend, device and invariant-mode status (the env section).
The engine settings, timings and throughput go to the log's sidecar, never into the log.

Errors a user can cause (a missing model, an empty prompt set, a missing field, an
unwritable output, a log that cannot be resumed) raise ModelError / RolloutError /
PromptError / LogError with a one-line message.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from bi_rl.model import environment, load_model, model_digest, resolve_model, tokenizer_digest
from bi_rl.rollout.engine import Engine, EngineConfig, Step
from bi_rl.rollout.log import LogWriter, open_for_resume
from bi_rl.rollout.prompts import load_prompts, prompts_digest
from bi_rl.rollout.sampler import SamplerConfig
from bi_rl.rollout.schema import RunHeader, RunSettings, RunSummary, Sidecar

__all__ = [
    "DEFAULT_OUT",
    "RolloutConfig",
    "RolloutError",
    "rollout",
    "run_settings",
    "run_summary",
]

DEFAULT_OUT = "rollouts/run.jsonl"


class RolloutError(RuntimeError):
    """A run that cannot proceed; the message is one line naming the problem."""


@dataclass(frozen=True)
class RolloutConfig:
    """Everything a run needs. model/prompts None means the embedded default; the sampling
    seed is the sampler's."""

    model: str | None = None
    prompts: str | None = None
    out: str = DEFAULT_OUT
    prompt_field: str = "prompt"
    id_field: str = "id"
    split: str | None = None
    chat_template: bool | None = None
    limit: int | None = None
    sampler: SamplerConfig = field(default_factory=SamplerConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    resume: bool = False
    overwrite: bool = False


def run_settings(model_path: Path, engine: Engine, prompts) -> RunSettings:
    """The header's run section (what determines the samples) for `engine` over `prompts`,
    with the model's and tokenizer's digests read from `model_path`."""
    return RunSettings(
        model_digest=model_digest(model_path),
        tokenizer_digest=tokenizer_digest(model_path),
        sampler=engine.sampler,
        n=engine.config.n,
        max_tokens=engine.config.max_tokens,
        stop_tokens=tuple(sorted(engine.stop_tokens)),
        stop_strings=engine.config.stop_strings,
        prompt_count=len(prompts),
        prompts_digest=prompts_digest(prompts),
    )


def run_summary(
    out: Path,
    records: int,
    resumed_from: int | None,
    generated: int,
    prefilled: int,
    seconds: float,
    engine: EngineConfig,
) -> RunSummary:
    """The sidecar's entry for a run that wrote `records` records to `out` in `seconds`."""
    return RunSummary(
        log=str(out),
        records=records,
        resumed_from=resumed_from,
        generated_tokens=generated,
        prefill_tokens=prefilled,
        seconds=round(seconds, 3),
        tokens_per_s=round(generated / seconds, 1) if seconds > 0 else None,
        engine=engine,
        finished_at=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    )


def _prepare_out(cfg: RolloutConfig) -> Path:
    out = Path(cfg.out)
    if out.is_dir():
        raise RolloutError(f"output {cfg.out!r} is a directory; pass a file path with --out")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise RolloutError(
            f"cannot create the output directory for {cfg.out!r}: {e.strerror}"
        ) from None
    if not os.access(out.parent, os.W_OK):
        raise RolloutError(f"output directory {str(out.parent)!r} is not writable")
    if out.exists() and out.stat().st_size > 0 and not (cfg.resume or cfg.overwrite):
        raise RolloutError(
            f"{cfg.out} already exists; pass --resume to continue it, --overwrite to replace it, "
            "or choose another --out"
        )
    if cfg.overwrite and out.exists():
        out.unlink()
    return out


def rollout(
    cfg: RolloutConfig, progress: Callable[[Step, int, int], None] | None = None
) -> RunSummary:
    """Run `cfg`; returns the run summary (also appended to the log's sidecar).

    progress(step, samples_done, samples_total) is called after every engine step.
    """
    out = _prepare_out(cfg)
    model_path, model_name = resolve_model(cfg.model)
    prompt_path = cfg.prompts
    if prompt_path is None:
        if cfg.model is not None:
            raise RolloutError(
                "--prompts is required with --model (the default prompts fit the default model)"
            )
        from bi_rl.assets import DEFAULT_PROMPTS

        prompt_path = DEFAULT_PROMPTS
    model, tokenizer = load_model(model_path)
    prompts = load_prompts(
        prompt_path,
        tokenizer,
        field=cfg.prompt_field,
        id_field=cfg.id_field,
        split=cfg.split,
        chat_template=cfg.chat_template,
        limit=cfg.limit,
    )
    engine = Engine(model, tokenizer, cfg.sampler, cfg.engine)
    header = RunHeader(
        run_settings(model_path, engine, prompts), environment(model_name, cfg.engine.mode)
    )
    try:
        writer = open_for_resume(out, header) if cfg.resume else LogWriter(out, header)
    except OSError as e:
        raise RolloutError(f"cannot write {cfg.out!r}: {e.strerror or e}") from None
    total = len(prompts) * cfg.engine.n
    start = writer.count
    t0, generated, prefilled = time.perf_counter(), 0, 0
    with writer:
        for step in engine.generate(prompts, start=start):
            writer.write(step.ready)
            generated += step.generated
            prefilled += step.prefilled
            if progress is not None:
                progress(step, writer.count, total)
    summary = run_summary(
        out,
        writer.count,
        start if cfg.resume else None,
        generated,
        prefilled,
        time.perf_counter() - t0,
        cfg.engine,
    )
    earlier = Sidecar.read(out).runs if cfg.resume else ()
    Sidecar((*earlier, summary)).write(out)
    return summary
