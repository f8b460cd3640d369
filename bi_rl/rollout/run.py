"""One rollout run end to end: check every input, then write the log.

`rollout(config)` is what `bi-rollout` runs, usable from Python as well. It records in the
log header (bi_rl.rollout.schema.RunHeader) the model's and tokenizer's digests, the sampler
settings and seed, and the prompt-set digest (the run section, which seeds the hash chain),
and the package versions, backend, device and invariant-mode status (the env section).
The engine settings, timings and throughput go to the log's sidecar, never into the log.

Invariant kept: the output is touched only after every input has been checked. In order:
the output path (a writable place; an existing log only with resume or overwrite), the
model and its tokenizer, the prompts, the prompts against the model's context, the engine
(the model's caches), and two tiny sequences run through the engine in the run's mode, so
an op the mode refuses stops the run before any file changes. A new log is then written
aside and put in place with its first records (bi_rl.rollout.log.LogWriter): a run refused
or stopped before its first sample leaves no log behind and, with overwrite, leaves the old
log and its sidecar as they were. A resumed log is verified before anything is appended.

Context policy (bi_rl.model.context_length: max_position_embeddings or the RoPE-scaled
length): a prompt longer than the context is an error; a prompt that fits but leaves fewer
than max_tokens positions warns (RolloutWarning); allow_long_context turns both off, for
models known to run past their configured context.

Errors a user can cause (a missing model, an empty prompt set, a missing field, a prompt too
long, an op the mode refuses, an unwritable output, a log that cannot be resumed) raise
ModelError / RolloutError / PromptError / LogError / NotImplementedError with a one-line
message. Ctrl-C raises RolloutInterrupted, which says whether the output holds a log that
--resume can continue.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path

from bi_rl._lock import held_elsewhere
from bi_rl.model import (
    Digests,
    context_length,
    environment,
    load_model,
    model_digest,
    resolve_model,
    tokenizer_digest,
)
from bi_rl.rollout import schema
from bi_rl.rollout.engine import Engine, EngineConfig, Step
from bi_rl.rollout.log import BUSY, LogWriter, check_resumable, open_for_resume
from bi_rl.rollout.paths import OutputError, check_output
from bi_rl.rollout.prompts import Prompt, load_prompts, prompts_digest
from bi_rl.rollout.sampler import SamplerConfig
from bi_rl.rollout.schema import RunHeader, RunSettings, RunSummary, Sidecar, max_record_bytes

__all__ = [
    "DEFAULT_OUT",
    "RolloutConfig",
    "RolloutError",
    "RolloutInterrupted",
    "RolloutWarning",
    "Plan",
    "check_out",
    "open_log",
    "plan",
    "rollout",
    "run_settings",
    "run_summary",
    "write_samples",
]

DEFAULT_OUT = "rollouts/run.jsonl"


class RolloutError(RuntimeError):
    """A run that cannot proceed; the message is one line naming the problem."""


class RolloutWarning(UserWarning):
    """A run that proceeds, but outside what the model was configured for."""


class RolloutInterrupted(KeyboardInterrupt):
    """Ctrl-C during a run. `resumable`: the output holds this run's log, which --resume
    continues; otherwise nothing was written and any earlier log there is as it was."""

    def __init__(self, out: str, resumable: bool):
        super().__init__(out)
        self.out, self.resumable = out, resumable


@dataclass(frozen=True)
class RolloutConfig:
    """Everything a run needs. model/prompts None means the embedded default; the sampling
    seed is the sampler's. allow_long_context: run prompts past the model's configured
    context without an error or a warning."""

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
    allow_long_context: bool = False


def run_settings(
    model_path: Path, engine: Engine, prompts, digests: Digests | None = None
) -> RunSettings:
    """The header's run section (what determines the samples) for `engine` over `prompts`,
    with the model's and tokenizer's digests read from `model_path` (`digests`: already
    being computed for it; waited for)."""
    return RunSettings(
        model_digest=digests.model() if digests else model_digest(model_path),
        tokenizer_digest=digests.tokenizer() if digests else tokenizer_digest(model_path),
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


def check_out(cfg: RolloutConfig) -> tuple[Path, bool]:
    """(output path, whether a new log replaces a file there); reads, never writes."""
    reads = []
    if cfg.prompts is not None and Path(cfg.prompts).is_file():
        reads.append((cfg.prompts, "the prompt file"))
    try:
        out = check_output(cfg.out, "--out", reads, log_ok=True)
    except OutputError as e:
        raise RolloutError(str(e)) from None
    if held_elsewhere(out):  # resumed, replaced or refused alike: another run is writing it
        raise RolloutError(f"{cfg.out}: {BUSY}, or choose another --out")
    if cfg.resume:
        check_resumable(out)
    elif out.exists() and out.stat().st_size > 0 and not cfg.overwrite:
        raise RolloutError(
            f"{cfg.out} already exists; pass --resume to continue it, --overwrite to replace it, "
            "or choose another --out"
        )
    return out, out.exists() and not cfg.resume


def _check_prompts(cfg: RolloutConfig, model_path: Path, prompts: Sequence[Prompt]) -> None:
    """The prompts against the model's context and the longest line a log may hold."""
    max_tokens = cfg.engine.max_tokens
    longest = max(prompts, key=lambda p: len(p.tokens))
    n = len(longest.tokens)
    ctx = context_length(model_path)
    if ctx is not None and not cfg.allow_long_context:
        extrapolate = "pass --allow-long-context for a model known to run past its context"
        if n > ctx:
            raise RolloutError(
                f"prompt {longest.id!r} is {n} tokens, longer than the model's context of "
                f"{ctx} positions (its config.json); shorten it, or {extrapolate}"
            )
        if n + max_tokens > ctx:
            warnings.warn(
                f"prompt {longest.id!r} ({n} tokens) plus --max-tokens {max_tokens} can run past "
                f"the model's context of {ctx} positions; lower --max-tokens, or {extrapolate}",
                RolloutWarning,
                stacklevel=3,
            )
    stops = cfg.engine.stop_strings
    for p in prompts:
        size = max_record_bytes(len(p.tokens), max_tokens, p.id, stops)
        if size > schema.MAX_LINE_BYTES:
            raise RolloutError(
                f"prompt {p.id!r} ({len(p.tokens)} tokens) with --max-tokens {max_tokens} could "
                f"make a log line of {size} bytes, over the {schema.MAX_LINE_BYTES} a log line "
                "may hold; lower --max-tokens"
            )


def _probe(model, tokenizer, cfg: RolloutConfig, prompts: Sequence[Prompt]) -> None:
    """Run two tiny sequences (one and two prompt tokens, so prefill, padding and batched
    decode all run) through the engine in the run's mode: an op the mode refuses for this
    model raises here, before the output is touched."""
    tokens = prompts[0].tokens
    tiny = [Prompt("probe-0", tokens[:2]), Prompt("probe-1", tokens[:1])]
    probe = replace(cfg.engine, n=1, max_tokens=2, batch_size=2, stop_strings=())
    for _ in Engine(model, tokenizer, cfg.sampler, probe).generate(tiny):
        pass


@dataclass(frozen=True)
class Plan:
    """A run whose inputs are all checked: the loaded engine, the prompts, the log header.

    The model's and tokenizer's digests are hashed in background threads from planning on;
    `make_header` (and `header`, its result) waits for them."""

    engine: Engine
    prompts: list[Prompt]
    make_header: Callable[[], RunHeader]

    @cached_property
    def header(self) -> RunHeader:
        return self.make_header()

    @property
    def total(self) -> int:
        """The records the finished log holds: prompts x n."""
        return len(self.prompts) * self.engine.config.n


def plan(cfg: RolloutConfig) -> Plan:
    """Load and check the model and prompts (context, mode probe), build the header; the
    output is not touched."""
    model_path, model_name = resolve_model(cfg.model)
    prompt_path = cfg.prompts
    if prompt_path is None:
        if cfg.model is not None:
            raise RolloutError(
                "--prompts is required with --model (the default prompts fit the default model)"
            )
        from bi_rl.assets import DEFAULT_PROMPTS

        prompt_path = DEFAULT_PROMPTS
    digests = Digests(model_path)  # hashed while the model loads, is checked and generates
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
    _check_prompts(cfg, model_path, prompts)
    engine = Engine(model, tokenizer, cfg.sampler, cfg.engine)
    _probe(model, tokenizer, cfg, prompts)
    env = environment(model_name, cfg.engine.mode)
    return Plan(
        engine, prompts, lambda: RunHeader(run_settings(model_path, engine, prompts, digests), env)
    )


def open_log(
    cfg: RolloutConfig,
    out: Path,
    header: RunHeader | Callable[[], RunHeader],
    replacing: bool,
    background: bool = False,
) -> LogWriter:
    """The writer of a checked run: the resumed log, or a new one written aside.

    background: a thread hashes, encodes and writes the records (bi_rl.rollout.log); a new
    log's header may then be a function, called by that thread, so generation starts while
    the digests are still being hashed, and the header still goes first."""
    try:
        if cfg.resume:  # the header decides where to continue: wait for it
            return open_for_resume(
                out, header() if callable(header) else header, background=background
            )
        out.parent.mkdir(parents=True, exist_ok=True)
        return LogWriter(
            out,
            header,
            replace=replacing,
            background=background,
            on_in_place=(lambda: Sidecar.path(out).unlink(missing_ok=True)) if replacing else None,
        )
    except OSError as e:
        raise RolloutError(f"cannot write {cfg.out!r}: {e.strerror or e}") from None


def write_samples(writer: LogWriter, samples, replacing: bool) -> None:
    """Append samples; when a new log replacing an old one reaches its place (with its first
    records), the old log's sidecar goes, since it described the replaced log (a writer
    opened by open_log does this itself, also from its writing thread)."""
    was_in_place = writer.in_place
    writer.write(samples)
    if replacing and writer.in_place and not was_in_place:
        Sidecar.path(writer.path).unlink(missing_ok=True)


def rollout(
    cfg: RolloutConfig, progress: Callable[[Step, int, int], None] | None = None
) -> RunSummary:
    """Run `cfg`; returns the run summary (also appended to the log's sidecar).

    progress(step, samples_done, samples_total) is called after every engine step.
    """
    out, replacing = check_out(cfg)
    p = plan(cfg)
    engine, prompts = p.engine, p.prompts
    # Every input is checked: from here on the output is written (by a thread of its own).
    writer = open_log(cfg, out, p.make_header, replacing, background=True)
    total = p.total
    start = writer.count
    t0, generated, prefilled = time.perf_counter(), 0, 0
    try:
        with writer:
            for step in engine.generate(prompts, start=start):
                write_samples(writer, step.ready, replacing)
                generated += step.generated
                prefilled += step.prefilled
                if progress is not None:
                    progress(step, writer.submitted, total)
    except OSError as e:
        kept = f"; {writer.count} samples are in the log: continue with --resume later"
        raise RolloutError(
            f"cannot write {cfg.out!r}: {e.strerror or e}" + (kept if writer.in_place else "")
        ) from None
    except KeyboardInterrupt:
        raise RolloutInterrupted(cfg.out, writer.in_place) from None
    seconds = time.perf_counter() - t0
    summary = run_summary(
        out,
        writer.count,
        start if cfg.resume else None,
        generated,
        prefilled,
        seconds,
        cfg.engine,
    )
    earlier = Sidecar.read(out).runs if cfg.resume else ()
    Sidecar((*earlier, summary)).write(out)
    return summary
