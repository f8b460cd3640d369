"""One rollout run end to end: resolve and load the model, read prompts, write the log.

`rollout(config)` is what `bi-rollout` runs, usable from Python as well. It records in the
log header the model's and tokenizer's digests (blake2b over their files), the sampler
settings, seed and prompt-set digest (the `run` section, which seeds the hash chain), and
the package versions, backend, device and invariant-mode status (the `env` section).
Timings and the batch size go to the sidecar file, never into the log.

Errors a user can cause (a missing model, an empty prompt set, a missing field, an
unwritable output, a log that cannot be resumed) raise RolloutError / PromptError /
LogError with a one-line message.
"""

from __future__ import annotations

import hashlib
import os
import platform
import re
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import orjson

from bi_rl.rollout.engine import Engine, EngineConfig, Step
from bi_rl.rollout.log import LogWriter, make_header, open_for_resume, sidecar_path
from bi_rl.rollout.prompts import load_prompts, prompts_digest
from bi_rl.rollout.sampler import SamplerConfig

__all__ = [
    "RolloutConfig",
    "RolloutError",
    "environment",
    "load_model",
    "model_digest",
    "resolve_model",
    "rollout",
    "tokenizer_digest",
]

DEFAULT_OUT = "rollouts/run.jsonl"
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
_TOKENIZER_FILES = re.compile(
    r"^(tokenizer.*|special_tokens_map\.json|added_tokens\.json|vocab\..*|merges\.txt"
    r"|chat_template\..*|.*\.tiktoken)$"
)


class RolloutError(RuntimeError):
    """A run that cannot proceed; the message is one line naming the problem."""


@dataclass(frozen=True)
class RolloutConfig:
    """Everything a run needs. model/prompts None means the embedded default."""

    model: str | None = None
    prompts: str | None = None
    out: str = DEFAULT_OUT
    prompt_field: str = "prompt"
    id_field: str = "id"
    split: str | None = None
    chat_template: bool | None = None
    limit: int | None = None
    seed: int = 0
    sampler: SamplerConfig = field(default_factory=SamplerConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    resume: bool = False
    overwrite: bool = False


def _digest_files(files: list[Path], person: bytes) -> str:
    h = hashlib.blake2b(digest_size=16, person=person)
    for f in sorted(files, key=lambda p: p.name):
        h.update(orjson.dumps([f.name, f.stat().st_size]))
        with open(f, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()


def model_digest(path) -> str:
    """blake2b-128 over config.json and the *.safetensors weight files (name, size, bytes)."""
    path = Path(path)
    files = [path / "config.json", *path.glob("*.safetensors")]
    return _digest_files([f for f in files if f.is_file()], b"bi-rl/model")


def tokenizer_digest(path) -> str:
    """blake2b-128 over the tokenizer files (tokenizer*, vocab, merges, chat template...)."""
    files = [f for f in Path(path).iterdir() if f.is_file() and _TOKENIZER_FILES.match(f.name)]
    return _digest_files(files, b"bi-rl/tokenizer")


def resolve_model(model: str | None) -> tuple[Path, str]:
    """(local directory, name recorded in the header) for a path, a hub id or None."""
    if model is None:
        try:
            from bi_rl.assets import DEFAULT_MODEL
        except ImportError:
            raise RolloutError(
                "no --model given and no embedded default model is installed"
            ) from None
        return Path(DEFAULT_MODEL), f"embedded:{Path(DEFAULT_MODEL).name}"
    path = Path(model).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise RolloutError(
                f"model {model!r}: directory has no config.json (not an mlx-lm model)"
            )
        return path, model
    if path.exists():
        raise RolloutError(f"model {model!r} is a file; pass an mlx-lm model directory")
    if not _HUB_ID.match(model):
        raise RolloutError(f"model {model!r}: no such directory")
    try:
        from mlx_lm.utils import _download

        return Path(_download(model)), model
    except Exception as e:
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise RolloutError(
            f"model {model!r} is not a local directory and could not be fetched from the hub "
            f"({reason})"
        ) from None


def load_model(path: Path):
    """mlx_lm.load for a local directory, with its failures turned into one-line errors."""
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    import mlx_lm

    try:
        return mlx_lm.load(str(path))
    except Exception as e:
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise RolloutError(f"cannot load model {str(path)!r}: {reason}") from None


def environment(model_name: str, mode: str) -> dict:
    """The env section of the header: versions, backend, device, invariant mode."""
    from importlib.metadata import PackageNotFoundError, version

    import mlx.core as mx

    import bi_rl
    from bi_rl.backends import device_name

    def ver(pkg):
        try:
            return version(pkg)
        except PackageNotFoundError:
            return None

    return {
        "model_path": model_name,
        "bi_rl": bi_rl.__version__,
        "mlx": mx.__version__,
        "mlx_lm": ver("mlx-lm"),
        "python": platform.python_version(),
        "platform": f"{sys.platform}-{platform.machine()}",
        "backend": bi_rl.active_backend().name,
        "device": device_name(),
        "invariant_mode": mode,
    }


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


def rollout(cfg: RolloutConfig, progress: Callable[[Step, int, int], None] | None = None) -> dict:
    """Run `cfg`; returns the run summary (also written to the sidecar file).

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
        prompt_path, tokenizer, field=cfg.prompt_field, id_field=cfg.id_field,
        split=cfg.split, chat_template=cfg.chat_template, limit=cfg.limit,
    )  # fmt: skip
    engine = Engine(model, tokenizer, cfg.sampler, cfg.engine, cfg.seed)
    run = {
        "model": {"digest": model_digest(model_path)},
        "tokenizer": {"digest": tokenizer_digest(model_path)},
        "sampler": cfg.sampler.to_dict(),
        "seed": cfg.seed,
        "n": cfg.engine.n,
        "max_tokens": cfg.engine.max_tokens,
        "stop_tokens": sorted(engine.stop_tokens),
        "stop_strings": list(cfg.engine.stop_strings),
        "prompts": {"count": len(prompts), "digest": prompts_digest(prompts)},
    }
    header = make_header(run, environment(model_name, cfg.engine.mode))
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
    seconds = time.perf_counter() - t0
    summary = {
        "log": str(out),
        "records": writer.count,
        "resumed_from": start if cfg.resume else None,
        "generated_tokens": generated,
        "prefill_tokens": prefilled,
        "seconds": round(seconds, 3),
        "tokens_per_s": round(generated / seconds, 1) if seconds > 0 else None,
        "engine": asdict(cfg.engine),
        "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    _append_sidecar(out, summary, keep=cfg.resume)
    return summary


def _append_sidecar(out: Path, summary: dict, keep: bool) -> None:
    """Add this run's summary to the sidecar's "runs" list (a resumed log keeps its history)."""
    side = sidecar_path(out)
    runs = []
    if keep and side.is_file():
        try:
            runs = list(orjson.loads(side.read_bytes()).get("runs", []))
        except (orjson.JSONDecodeError, AttributeError):
            runs = []
    runs.append(summary)
    side.write_bytes(orjson.dumps({"runs": runs}, option=orjson.OPT_INDENT_2) + b"\n")
