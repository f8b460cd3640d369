"""Audit of rollout logs: integrity by hash, comparison of two logs, re-derivation of tokens.

Three checks, each naming the first thing that fails (line, record, token):

- `audit_log(path)` without a model: the header (format, version, digest, genesis), every
  record's form and hash chain (bi_rl.rollout.schema: a changed bit anywhere, a dropped,
  duplicated or reordered record, an edited run header all break it), the canonical record
  order (prompt_index, sample), prompt ids and tokens consistent across a prompt's samples,
  finish reasons consistent with the header's stop tokens and max_tokens, and the record
  count against the header's prompt count times n (a log cut after a whole record still has
  a valid chain: only the count catches it), and the byte form (each line exactly the
  writer's JSON and one LF; a record field the format does not define is refused, since no
  hash covers it). A last line without its newline is named: torn, or complete but unended.

- `compare_logs(a, b)`: two logs made by the same run settings (equal genesis) must hold the
  same hashes; the first record and token where they part is named, with both values. The
  env section (machine, backend, versions) is outside the chain, so logs from two machines
  compare token for token; env differences are listed as information.

- `rederive(path, model, tokenizer)`: rescore every record with the scorer, re-deriving each
  token with the header's sampler: each logged token must be the token the sampler draws
  from its key (seed, prompt id, sample, position) and the model's logits, and each
  logprob and row fingerprint must be bitwise the recomputed one. This proves the tokens were
  sampled as logged, which a hash chain alone cannot (anyone can rebuild a chain).

Invariant kept: auditing reads logs and never writes them.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from bi_rl.mode import DEFAULT_MODE
from bi_rl.rollout.engine import DEFAULT_BATCH_SIZE
from bi_rl.rollout.log import iter_records, read_header, read_lines
from bi_rl.rollout.schema import (
    LogError,
    LogRecord,
    RunHeader,
    RunSettings,
    differing_fields,
    sample_label,
)
from bi_rl.score.report import MismatchReport
from bi_rl.score.rescore import compare_records

__all__ = [
    "AuditResult",
    "CompareResult",
    "DeriveResult",
    "Problem",
    "audit_log",
    "compare_logs",
    "rederive",
]


@dataclass(frozen=True)
class Problem:
    """What failed and where: `line` in the file, `record` (0-based), `token` (0-based)."""

    message: str
    line: int | None = None
    record: int | None = None
    token: int | None = None
    label: str | None = None  # the record's prompt id and sample, when it could be read

    def where(self, path) -> str:
        at = str(path) if self.line is None else f"{path}:{self.line}"
        if self.record is not None:
            at += f": record {self.record}"
            if self.label:
                at += f" ({self.label})"
        if self.token is not None:
            at += f": token {self.token}"
        return at


@dataclass
class AuditResult:
    path: str
    records: int = 0  # records read and verified before any problem
    tokens: int = 0
    expected_records: int | None = None
    last_hash: str | None = None
    header: RunHeader | None = None
    problem: Problem | None = None

    @property
    def ok(self) -> bool:
        return self.problem is None

    def summary(self) -> str:
        if self.problem is not None:
            return f"{self.problem.where(self.path)}: {self.problem.message}"
        return (
            f"{self.path}: OK: {self.records} records, {self.tokens} tokens, header digest "
            f"and hash chain verified (last hash {self.last_hash})"
        )

    def to_json(self) -> dict:
        d = {k: v for k, v in asdict(self).items() if k != "header"}
        d["ok"] = self.ok
        return d


def _consistency(
    rec: LogRecord, index: int, run: RunSettings, prompts: dict
) -> tuple[str, int] | None:
    """(message, token) for the first way `rec` contradicts the run settings, else None."""
    n = run.n
    if (rec.prompt_index, rec.sample) != divmod(index, n):
        want = divmod(index, n)
        message = (
            f"out of canonical order: holds prompt index {rec.prompt_index} sample {rec.sample}, "
            f"expected prompt index {want[0]} sample {want[1]}"
        )
        return message, None
    seen = prompts.setdefault(rec.prompt_index, (rec.prompt_id, rec.prompt_tokens))
    if seen != (rec.prompt_id, rec.prompt_tokens):
        return "prompt id or tokens differ from the prompt's other samples", None
    if not rec.tokens:
        return "record has no completion tokens", None
    stops = set(run.stop_tokens)
    for j, t in enumerate(rec.tokens[:-1]):
        if t in stops:
            return f"stop token {t} before the last token (generation would have ended)", j
    last = len(rec.tokens) - 1
    if len(rec.tokens) > run.max_tokens:
        return f"{len(rec.tokens)} tokens exceed max_tokens {run.max_tokens}", None
    if rec.finish == "length":
        if len(rec.tokens) != run.max_tokens or rec.tokens[-1] in stops:
            return "finish 'length' but the completion did not reach max_tokens", last
    elif isinstance(rec.stop, int):
        if rec.stop not in stops or rec.tokens[-1] != rec.stop:
            return f"finish 'stop' on token {rec.stop}, which is not the last token or a stop", last
    elif rec.stop not in run.stop_strings:
        return f"finish 'stop' on {rec.stop!r}, which is not one of the run's stop strings", last
    return None


def audit_log(path) -> AuditResult:
    """Verify the log at `path`; the result names the first problem, if any."""
    res = AuditResult(path=str(path))
    try:
        header = read_header(path)
    except LogError as e:
        res.problem = Problem(_strip(e), line=e.line)
        return res
    res.header = header
    run = header.run
    res.expected_records = run.prompt_count * run.n
    prompts: dict = {}
    last: LogRecord | None = None
    try:
        for index, rec in enumerate(iter_records(path, verify=True)):
            bad = _consistency(rec, index, run, prompts)
            if bad is not None:
                res.problem = Problem(
                    bad[0], line=index + 2, record=index, token=bad[1], label=rec.label
                )
                return res
            res.records += 1
            res.tokens += len(rec.tokens)
            res.last_hash = rec.hash
            last = rec
    except LogError as e:
        record = e.line - 2 if e.line is not None and e.line >= 2 else None
        res.problem = Problem(
            _strip(e), line=e.line, record=record, token=e.token, label=_peek_label(path, e.line)
        )
        return res
    if res.records != res.expected_records:
        after = f" (the last is {last.label})" if last is not None else ""
        what = "ends early" if res.records < res.expected_records else "has extra records"
        res.problem = Problem(
            f"log {what}: {res.records} records{after}, the header promises "
            f"{run.prompt_count} prompts x n={run.n} = {res.expected_records}",
            line=res.records + 2 if res.records < res.expected_records else None,
            record=res.records,
        )
    return res


def _strip(e: LogError) -> str:
    """LogError's message without the location prefix (Problem.where rebuilds it)."""
    msg = str(e)
    prefix = e.path if e.line is None else f"{e.path}:{e.line}"
    if e.token is not None:
        prefix += f": token {e.token}"
    return msg[len(prefix) + 2 :] if msg.startswith(prefix + ": ") else msg


def _peek_label(path, line: int | None) -> str | None:
    """The prompt id and sample of the record on `line`, when that line parses as JSON."""
    if line is None or line < 2:
        return None
    import orjson

    try:
        for i, raw, _ in read_lines(path):
            if i == line:
                obj = orjson.loads(raw)
                return sample_label(obj["prompt_id"], obj["prompt_index"], obj["sample"])
    except Exception:
        return None
    return None


# -- two logs --------------------------------------------------------------------------------


@dataclass
class CompareResult:
    a: AuditResult
    b: AuditResult
    identical: bool = False
    run_differences: list[str] = field(default_factory=list)
    env_differences: list[str] = field(default_factory=list)
    records_compared: int = 0
    first_difference: dict | None = None
    message: str = ""

    def to_json(self) -> dict:
        return {
            "identical": self.identical,
            "message": self.message,
            "a": self.a.to_json(),
            "b": self.b.to_json(),
            "run_differences": self.run_differences,
            "env_differences": self.env_differences,
            "records_compared": self.records_compared,
            "first_difference": self.first_difference,
        }


def _token_view(rec: LogRecord, j: int) -> dict | None:
    if j >= len(rec.tokens):
        return None
    lp = float(rec.logprobs[j])
    return {
        "token": rec.tokens[j],
        "logprob": lp,
        "logprob_bits": rec.logprob_bits[j],
        "fingerprint": rec.fingerprints[j],
        "hash": rec.hashes[j],
    }


def compare_logs(path_a, path_b) -> CompareResult:
    """Audit both logs, then compare them hash for hash."""
    res = CompareResult(audit_log(path_a), audit_log(path_b))
    for side in (res.a, res.b):
        if not side.ok:
            res.message = f"cannot compare: {side.summary()}"
            return res
    ha, hb = res.a.header, res.b.header
    res.env_differences = differing_fields(ha.env.to_json(), hb.env.to_json())
    if ha.genesis != hb.genesis:
        res.run_differences = differing_fields(ha.run.to_json(), hb.run.to_json())
        res.message = (
            "the logs come from different run settings (genesis hashes differ): "
            + ", ".join(res.run_differences)
        )
        return res
    for i, (x, y) in enumerate(zip(iter_records(path_a), iter_records(path_b), strict=True)):
        if x.hash == y.hash:
            res.records_compared += 1
            continue
        pairs = zip(x.hashes, y.hashes, strict=False)  # lengths may differ
        j = next((k for k, (u, v) in enumerate(pairs) if u != v), min(len(x.hashes), len(y.hashes)))
        res.first_difference = {
            "record": i,
            "line": i + 2,
            "label": x.label,
            "token": j,
            "a": _token_view(x, j),
            "b": _token_view(y, j),
            "a_tokens": len(x.tokens),
            "b_tokens": len(y.tokens),
        }
        what = ""
        if res.first_difference["a"] and res.first_difference["b"]:
            ta, tb = res.first_difference["a"], res.first_difference["b"]
            what = (
                f": token {ta['token']} logprob {ta['logprob']!r} vs token {tb['token']} "
                f"logprob {tb['logprob']!r}"
            )
        elif len(x.tokens) != len(y.tokens):
            what = f": {len(x.tokens)} vs {len(y.tokens)} tokens"
        res.message = f"logs differ first at record {i} ({x.label}), token {j}{what}"
        return res
    res.identical = True
    res.message = (
        f"{res.records_compared} records, {res.a.tokens} tokens, every hash equal "
        f"(last {res.a.last_hash})"
    )
    return res


# -- re-derivation with a model --------------------------------------------------------------


@dataclass
class DeriveResult:
    records: int
    tokens: int
    tokens_equal: int
    first_token_mismatch: dict | None
    stop_string_problem: dict | None
    report: MismatchReport  # logprobs and fingerprints, logged vs recomputed

    @property
    def ok(self) -> bool:
        return (
            self.tokens_equal == self.tokens
            and self.report.identical
            and self.stop_string_problem is None
        )

    def to_json(self) -> dict:
        d = {k: v for k, v in asdict(self).items() if k != "report"}
        d["report"] = self.report.to_json()
        d["ok"] = self.ok
        return d


def rederive(
    path,
    model,
    tokenizer=None,
    *,
    batch_size: int = DEFAULT_BATCH_SIZE,
    mode: str = DEFAULT_MODE,
    progress=None,
):
    """Re-derive every token of a verified log from its key and the model's logits.

    progress: as bi_rl.score.scorer.score's."""
    from bi_rl.rollout.sampler import sequence_id
    from bi_rl.score.scorer import Item, ScoreConfig, score

    header, records = read_header(path), list(iter_records(path))
    sampler = header.run.sampler
    items = [Item(r.prompt_tokens, r.tokens, sequence_id(r.prompt_id, r.sample)) for r in records]
    cfg = ScoreConfig(batch_size=batch_size, temperature=sampler.temperature, mode=mode)
    scored = score(model, items, cfg, derive=sampler, progress=progress)
    first, equal, total = None, 0, 0
    for i, (rec, s) in enumerate(zip(records, scored, strict=True)):
        total += len(rec.tokens)
        same = [a == b for a, b in zip(rec.tokens, s.tokens, strict=True)]
        equal += sum(same)
        if first is None and not all(same):
            j = same.index(False)
            first = {
                "record": i,
                "line": i + 2,
                "label": rec.label,
                "token": j,
                "logged": rec.tokens[j],
                "derived": s.tokens[j],
            }
    stop_problem = None
    if tokenizer is not None:
        for i, rec in enumerate(records):
            if isinstance(rec.stop, str):
                before = tokenizer.decode(list(rec.tokens[:-1]))
                if rec.stop not in tokenizer.decode(list(rec.tokens)) or rec.stop in before:
                    stop_problem = {
                        "record": i,
                        "line": i + 2,
                        "label": rec.label,
                        "message": f"stop string {rec.stop!r} is not first "
                        "completed by the last token",
                    }
                    break
    report = compare_records(records, scored)
    return DeriveResult(len(records), total, equal, first, stop_problem, report)
