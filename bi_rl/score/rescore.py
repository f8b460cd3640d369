"""Rescoring a rollout log: the model it names, a different batch composition, a report.

`rescore_log(config)` is what `bi-rescore` runs, usable from Python too:
  1. read and verify the log (header digest, hash chain: bi_rl.rollout.schema);
  2. find the model the log was made with (`--model`, else the header's model path; the
     embedded default for `embedded:` logs) and refuse it when its weights/config digest,
     its tokenizer digest or the active backend differ from the header, naming each
     difference (`force` proceeds anyway and records the differences); the digests are
     hashed while the model loads (and, in `rescore_log`, while it scores), and compared
     before any result is given;
  3. rescore every record with the scorer in a composition that differs from the
     rollout's: by default a batch size one below the rollout's (read from the log's
     sidecar; 7 when unknown, 2 when the rollout decoded alone; never one a resumed run
     used) and a shuffled order; and
     whole-sequence forward passes where the rollout decoded token by token;
  4. compare bit patterns and KL estimators (bi_rl.score.report).

Invariant kept: the log is only read. The result records the fully resolved settings, the
composition actually run and the environment, so a report is self-describing.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from bi_rl._split import SPLIT_ENV
from bi_rl.mode import DEFAULT_MODE, MODES
from bi_rl.model import (
    Digests,
    Environment,
    ModelError,
    environment,
    load_model,
    resolve_model,
)
from bi_rl.rollout.engine import DEFAULT_BATCH_SIZE
from bi_rl.rollout.log import LogError, iter_records, read_header
from bi_rl.rollout.schema import LogRecord, RunHeader, Sidecar
from bi_rl.score.report import MismatchReport, compare
from bi_rl.score.scorer import Item, ScoreConfig, ScoreTrace, score, shuffled_order

__all__ = [
    "ORDERS",
    "ModelMismatch",
    "RescoreConfig",
    "RescoreResult",
    "Rescoring",
    "compare_records",
    "default_batch_size",
    "header_mismatches",
    "finish",
    "locate_model",
    "log_mode",
    "padded_rows",
    "prepare",
    "refuse_mismatches",
    "rescore_log",
]

ORDERS = ("shuffled", "canonical", "reversed", "longest-first")
NOTED_ENV = ("mlx", "mlx_lm", "bi_rl", "device")  # differences are reported, not refused


class ModelMismatch(ModelError):
    """The model, tokenizer or backend differs from the log's header; the message names how."""


@dataclass(frozen=True)
class RescoreConfig:
    """What to rescore and how. batch_size None: one below the rollout's (see module doc);
    mode None: the mode the log was made with (its header)."""

    log: str
    model: str | None = None
    batch_size: int | None = None
    order: str = "shuffled"
    shuffle_seed: int = 0
    chunk: int | None = None
    mode: str | None = None
    force: bool = False

    def __post_init__(self):
        if self.mode is not None and self.mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        if self.order not in ORDERS:
            raise ValueError(f"order must be one of {', '.join(ORDERS)}, got {self.order!r}")
        if self.batch_size is not None and self.batch_size < 1:
            raise ValueError(f"batch size must be >= 1, got {self.batch_size}")
        if self.chunk is not None and self.chunk < 1:
            raise ValueError(f"chunk must be >= 1, got {self.chunk}")
        if self.shuffle_seed < 0:  # numpy's generator takes any integer >= 0
            raise ValueError(f"shuffle seed must be >= 0, got {self.shuffle_seed}")


@dataclass
class RescoreResult:
    log: str
    model: str
    header_checks: dict  # name -> {"log": ..., "here": ..., "equal": bool}
    forced: list[str]  # checks that failed and were overridden by force
    env_notes: list[str]  # versions or device that differ from the log's (not refused)
    composition: dict
    report: MismatchReport
    seconds: float
    environment: Environment

    @property
    def ok(self) -> bool:
        return self.report.identical

    def to_json(self) -> dict:
        d = asdict(self)
        d["report"] = self.report.to_json()
        d["ok"] = self.ok
        return d


def compare_records(records: list[LogRecord], scored) -> MismatchReport:
    """Each logged record's logprobs and fingerprints against its rescored twin, bit for bit."""
    return compare(
        [r.logprob_bits for r in records],
        [s.logprob_bits for s in scored],
        rollout_fingerprints=[r.fingerprints for r in records],
        rescored_fingerprints=[s.fingerprints for s in scored],
        tokens=[r.tokens for r in records],
        labels=[r.label for r in records],
    )


def default_batch_size(rollout_sizes: list[int]) -> int:
    """A batch size none of the rollout's runs used: one below the last, else the nearest."""
    used = rollout_sizes or [DEFAULT_BATCH_SIZE]  # bi-rollout's default when unknown
    last = used[-1]
    for d in range(1, last + len(used) + 2):
        for bs in (last - d, last + d):
            if bs >= 1 and bs not in used:
                return bs
    raise AssertionError("unreachable: some batch size is always unused")


def locate_model(header: RunHeader, model: str | None) -> tuple[Path, str]:
    """(directory, name) of the model to use: `model` if given, else the one the header names."""
    if model is not None:
        return resolve_model(model)
    recorded = header.env.model_path
    if recorded.startswith("embedded:"):
        path, name = resolve_model(None)
        if name != recorded:
            raise ModelError(
                f"the log was made with {recorded}, but the embedded model here is {name}; "
                "pass --model"
            )
        return path, name
    if recorded and Path(recorded).expanduser().is_dir():
        return resolve_model(recorded)
    raise ModelError(
        f"the log's model {recorded!r} is not a directory on this machine; pass --model DIR"
    )


def log_mode(header: RunHeader, mode: str | None) -> str:
    """`mode` if given, else the run mode the log's header records (strict if it names none
    this version knows): a log made with --mode fallback is rescored in fallback."""
    if mode is not None:
        return mode
    logged = header.env.invariant_mode
    return logged if logged in MODES else DEFAULT_MODE


def header_mismatches(
    header: RunHeader, path: Path, backend: str | None = None, digests: Digests | None = None
) -> dict:
    """Model digest, tokenizer digest and backend: the log's value, this machine's, equal?

    digests: the directory's, already being computed (else computed here)."""
    from bi_rl.backends import active

    digests = digests or Digests(path)
    here = {
        "model": digests.model(),
        "tokenizer": digests.tokenizer(),
        "backend": backend or active().name,
    }
    log = {
        "model": header.run.model_digest,
        "tokenizer": header.run.tokenizer_digest,
        "backend": header.env.backend,
    }
    return {k: {"log": log[k], "here": here[k], "equal": log[k] == here[k]} for k in here}


def refuse_mismatches(checks: dict, force: bool, verb: str) -> list[str]:
    """Names of the failed header checks; raises ModelMismatch naming them unless `force`."""
    failed = [k for k, v in checks.items() if not v["equal"]]
    if failed and not force:
        what = "; ".join(
            f"{k} {checks[k]['log']} in the log, {checks[k]['here']} here" for k in failed
        )
        verb_ = "differs" if len(failed) == 1 else "differ"
        raise ModelMismatch(
            f"{' and '.join(failed)} {verb_} from the log's header ({what}); "
            f"pass --force to {verb} anyway"
        )
    return failed


def _order(kind: str, items: list[Item], seed: int) -> list[int]:
    n = len(items)
    if kind == "canonical":
        return list(range(n))
    if kind == "reversed":
        return list(range(n))[::-1]
    if kind == "longest-first":
        return sorted(range(n), key=lambda i: -(len(items[i].prompt) + len(items[i].completion)))
    return shuffled_order(n, seed)


@dataclass
class Rescoring:
    """A rescoring ready to run: the verified log, the loaded model, the composition."""

    cfg: RescoreConfig
    header: RunHeader
    records: list[LogRecord]
    model_name: str
    model_path: Path
    digests: Digests  # of the model directory, hashed from `prepare` on
    model: object
    rollout_sizes: list[int]
    items: list[Item]
    order: list[int]  # the order samples are batched in
    config: ScoreConfig
    checks: dict | None = None  # set by `check`
    forced: list[str] | None = None

    def check(self) -> None:
        """Compare the model's digests and the backend with the log's header (waiting for
        the digests); ModelMismatch unless they agree or cfg.force. Once."""
        if self.checks is None:
            checks = header_mismatches(self.header, self.model_path, digests=self.digests)
            self.forced = refuse_mismatches(checks, self.cfg.force, "rescore")
            self.checks = checks


def prepare(cfg: RescoreConfig, check: bool = True) -> Rescoring:
    """Read and verify the log, find, check and load its model, choose the composition.
    Raises LogError or ModelError (ModelMismatch) on bad input. The digests are hashed while
    the model loads; with check=False they are compared later (`Rescoring.check`, which
    `finish` calls), so that hashing overlaps the scoring too."""
    header = read_header(cfg.log)
    records = list(iter_records(cfg.log, verify=True))
    if not records:
        raise LogError(
            cfg.log,
            2,
            f"no records to rescore (the header promises {_promised(header)}): the run that "
            "wrote this log stopped before its first sample",
        )
    path, name = locate_model(header, cfg.model)
    digests = Digests(path)
    model, _ = load_model(path)
    temperature = float(header.run.sampler.temperature)
    rollout_sizes = Sidecar.read(cfg.log).batch_sizes()
    bs = cfg.batch_size if cfg.batch_size is not None else default_batch_size(rollout_sizes)
    items = [Item(r.prompt_tokens, r.tokens) for r in records]
    order = _order(cfg.order, items, cfg.shuffle_seed)
    config = ScoreConfig(bs, cfg.chunk, temperature, log_mode(header, cfg.mode))
    r = Rescoring(
        cfg, header, records, name, path, digests, model, rollout_sizes, items, order, config
    )
    if check:
        r.check()
    return r


def _promised(header: RunHeader) -> int:
    return header.run.prompt_count * header.run.n


def finish(
    r: Rescoring, scored, *, batches: int, padded_rows: int, seconds: float, ranks: int = 1
) -> RescoreResult:
    """The result of a rescoring: `scored` (in log order) compared with the log's records.

    batches / padded_rows: the forward passes run and the rows in them that were padded,
    over all ranks. Checks the model's digests first (`Rescoring.check`)."""
    r.check()
    cfg, header, records = r.cfg, r.header, r.records
    report = compare_records(records, scored)
    rollout_sizes, bs = r.rollout_sizes, r.config.batch_size
    composition = {
        "rollout": "KV-cached batched decode, one token per step"
        + (
            f", batch size {', '.join(map(str, rollout_sizes))}"
            if rollout_sizes
            else " (batch size unknown: no sidecar)"
        ),
        "rescore": "full-sequence forward passes, right padded"
        + (f", chunks of {cfg.chunk} through a KV cache" if cfg.chunk else ""),
        "rollout_batch_sizes": rollout_sizes,
        "batch_size": bs,
        "order": cfg.order if cfg.order != "shuffled" else f"shuffled (seed {cfg.shuffle_seed})",
        "chunk": cfg.chunk,
        "mode": r.config.mode,
        "mode_from": "the log's header" if cfg.mode is None else "the command line",
        "rollout_mode": header.env.invariant_mode,
        "batches": batches,
        "padded_rows": padded_rows,
        "ranks": ranks,
        "differs_from_rollout": bs not in rollout_sizes or cfg.order != "canonical",
    }
    env = environment(r.model_name, r.config.mode)
    logged = header.env
    notes = [
        f"{k} {getattr(logged, k)} in the log, {getattr(env, k)} here"
        for k in NOTED_ENV
        if getattr(logged, k) != getattr(env, k)
    ]
    split = _split_note(logged, env)
    if split:
        notes.append(split)
    promised = _promised(header)
    if len(records) < promised:
        notes.append(f"the log is incomplete: {len(records)} of {promised} records rescored")
    return RescoreResult(
        log=str(cfg.log),
        model=r.model_name,
        header_checks=r.checks,
        forced=r.forced,
        env_notes=notes,
        composition=composition,
        report=report,
        seconds=round(seconds, 3),
        environment=env,
    )


def _split_note(logged: Environment, here: Environment) -> str | None:
    """A note where the log's attention split size (bi_rl._split) is not this process's on
    the same backend: each size gives other bits, so rescoring then differs for that reason
    alone. A CUDA log that records none predates the record; those were made at 256 keys."""
    if logged.backend != here.backend or logged.attention_split == here.attention_split:
        return None
    if logged.attention_split is None:
        return (
            f"the log does not record its attention split size (logs made before it was "
            f"recorded used 256 keys a split), {here.attention_split} here: set "
            f"{SPLIT_ENV}=256 to rescore such a log bit for bit"
        )
    return (
        f"attention split {logged.attention_split} keys in the log, {here.attention_split} "
        f"here: other bits; set {SPLIT_ENV}={logged.attention_split} to rescore it bit for bit"
    )


def padded_rows(trace: ScoreTrace) -> int:
    """Rows of the traced batches that carried right padding."""
    return sum(1 for p in trace.padding for x in p if x)


def rescore_log(
    cfg: RescoreConfig, progress: Callable[[int, int, int], None] | None = None
) -> RescoreResult:
    """Rescore the log `cfg.log`; raises LogError or ModelError (ModelMismatch) on bad input.

    The model's digests are hashed while it loads and scores and compared before any result
    is given; an error while scoring is reported as the mismatch where there is one.
    progress(samples done, samples, tokens scored since the last call) follows the scoring.
    """
    r = prepare(cfg, check=False)
    trace = ScoreTrace()
    t0 = time.perf_counter()
    try:
        scored = score(r.model, r.items, r.config, order=r.order, trace=trace, progress=progress)
    except (ValueError, NotImplementedError):
        r.check()
        raise
    seconds = time.perf_counter() - t0
    return finish(
        r, scored, batches=len(trace.batches), padded_rows=padded_rows(trace), seconds=seconds
    )
