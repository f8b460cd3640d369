"""The rollout log's format: a typed header, one record schema, the hash chain, a version.

Format (version 1). One JSON object per line, UTF-8, written with orjson (sorted keys).

Byte form: a log is its bytes. Each line is exactly `canon(obj) + b"\n"`: orjson's
serialization with sorted keys (no spaces, shortest float form, non-ASCII as UTF-8) and a
single LF, the last line included. Readers (bi-audit, bi-rescore, `--resume`) refuse any
other form, naming the line: CR LF line ends, re-formatted or re-ordered JSON, a last line
without its LF. The hash chain covers values, so this check is what makes two logs with
equal hashes equal byte for byte. A line holds at most MAX_LINE_BYTES (64 MiB, LF
included; a record of about 800,000 tokens); readers refuse a longer line after reading
that much of it, so memory per line stays bounded, and bi-rollout refuses a run whose
prompts and max_tokens could write one.

Line 1, the header (`RunHeader`)::

    {"format": "bi-rl.rollout", "version": 1,
     "run": {...},     # what determines the samples; hashed into the chain's genesis
     "env": {...},     # where and with what they were made; not in the chain
     "genesis": hex,   # genesis_hash(run)
     "digest": hex}    # header_digest(header): blake2b-128 of the header without "digest"

  run (`RunSettings`): {"model": {"digest"}, "tokenizer": {"digest"}, "sampler":
  {"temperature", "top_p", "top_k", "min_p"}, "seed", "n", "max_tokens", "stop_tokens",
  "stop_strings", "prompts": {"count", "digest"}}. "sampler" and "seed" are the fields of
  `SamplerConfig`, every one of them, so a new sampler setting enters the hash.

  env (`bi_rl.model.Environment`): {"model_path", "bi_rl", "mlx", "mlx_lm", "python",
  "platform", "backend", "device", "invariant_mode", "attention_split"}; the last (keys a
  split of the CUDA attention kernels, which set their bits) only on CUDA, and absent from
  logs made before it was recorded. The chain leaves env out, so logs made on two machines
  or backends with bitwise-equal samples have equal hashes, and `bi-audit A B` can compare
  them token for token.

Then one line per finished sample (`LogRecord`), in canonical order (prompt_index, then
sample)::

    {"prompt_index": int, "prompt_id": str, "sample": int,
     "prompt_tokens": [int], "tokens": [int],         # completion tokens, stop token included
     "logprob_bits": [int],   # float32 bit pattern (uint32) of each token's logprob
     "fingerprints": [int],   # 64-bit row fingerprint of each token's logits (bi_rl.logprobs)
     "hashes": [hex],         # chained hash after each token
     "finish": "stop" | "length",
     "stop": int | str | null,   # the stop token id or stop string that ended it
     "hash": hex}             # the record's closing hash: the next record chains from it

The chain (blake2b, 16-byte digests, a distinct personalisation per kind of step; canon(x)
is orjson with sorted keys)::

    genesis = B("bi-rl/genesis", canon(run))
    h_0     = B("bi-rl/record",  prev || canon([prompt_index, prompt_id, sample, prompt_tokens]))
    h_i+1   = B("bi-rl/token",   h_i || le32(token) || le32(logprob_bits) || le64(fingerprint))
    hash    = B("bi-rl/end",     h_n || canon([finish, stop, n_tokens]))

where prev is the genesis for the first record and the previous record's `hash` after.
A changed bit anywhere in a record, a dropped, duplicated or reordered record, or an
edited run header breaks the chain at a nameable record and token.

Only the fields above exist. The chain covers exactly the record fields listed, so a field
added to a record (a reward, a text) would be data no hash vouches for: readers refuse a
record with any other field, naming it, as they refuse a header field this version does not
define (the header digest covers the whole header). Logs written to this specification, and
their hashes, stay valid; annotations belong in a separate file keyed by the record's hash.

Versioning: VERSION names this exact set of fields. Any change to a field the header or a
record holds (a new `SamplerConfig` setting too: it changes every new log's genesis) must
bump it; a reader refuses any other version, and a header that does not map exactly onto
these types. tests/test_schema.py pins the hashed fields of each version.

Beside the log, a sidecar (`Sidecar`, LOG.run.json) keeps what may differ between runs of
the same log and never enters it: per run (a resumed log has several) the engine settings
(batch size, prefill chunk, mode), the number of ranks, timings and throughput, and, for a
run that stopped early but could say so (a distributed run that lost a rank), why.
"""

from __future__ import annotations

import hashlib
import os
import struct
from dataclasses import asdict, dataclass, fields
from functools import cached_property
from pathlib import Path

import numpy as np
import orjson

from bi_rl.logprobs import logprobs_from_bits
from bi_rl.model import Environment
from bi_rl.rollout.engine import EngineConfig
from bi_rl.rollout.sampler import SamplerConfig

__all__ = [
    "FORMAT",
    "MAX_LINE_BYTES",
    "RECORD_FIELDS",
    "VERSION",
    "LogError",
    "LogRecord",
    "RunHeader",
    "RunSettings",
    "RunSummary",
    "Sidecar",
    "canon",
    "chain_record",
    "differing_fields",
    "genesis_hash",
    "line_form_error",
    "max_record_bytes",
    "header_digest",
    "sample_label",
]

FORMAT = "bi-rl.rollout"
VERSION = 1
MAX_LINE_BYTES = 64 << 20  # the longest line a log may hold, LF included
_U32, _U64 = 1 << 32, 1 << 64


class LogError(ValueError):
    """A log that is malformed, truncated or fails its chain; names the line and token."""

    def __init__(self, path, line: int | None, message: str, token: int | None = None):
        self.path, self.line, self.token = str(path), line, token
        where = str(path) if line is None else f"{path}:{line}"
        if token is not None:
            where += f": token {token}"
        super().__init__(f"{where}: {message}")


def canon(x) -> bytes:
    """The canonical bytes of a JSON value: orjson with sorted keys (what the log holds)."""
    return orjson.dumps(x, option=orjson.OPT_SORT_KEYS)


def line_form_error(raw: bytes, obj) -> str | None:
    """Why the line `raw` (read with its LF) is not the canonical bytes of `obj`, else None."""
    if raw.endswith(b"\r\n"):
        return "line ends in CR LF; a log line ends in LF alone (convert with dos2unix)"
    if raw != canon(obj) + b"\n":
        return (
            "line is not the writer's exact JSON (orjson, sorted keys, no spaces): the log "
            "was re-formatted"
        )
    return None


def max_record_bytes(prompt_tokens: int, max_tokens: int, prompt_id: str, stops=()) -> int:
    """An upper bound on the bytes of one record's line, LF included (see MAX_LINE_BYTES)."""
    per_token = 11 + 11 + 21 + 35  # token, logprob bits, fingerprint, hash, with commas
    text = 6 * (len(prompt_id) + max((len(s) for s in stops), default=10))  # \uXXXX escapes
    return 400 + text + 11 * prompt_tokens + per_token * max_tokens


def _b(person: bytes, *parts: bytes) -> bytes:
    h = hashlib.blake2b(digest_size=16, person=person)
    for p in parts:
        h.update(p)
    return h.digest()


def genesis_hash(run: dict) -> str:
    """The chain's starting hash, from the header's run section (as JSON)."""
    return _b(b"bi-rl/genesis", canon(run)).hex()


def header_digest(header: dict) -> str:
    """blake2b-128 of the canonical header (as JSON) without its own "digest" field."""
    return _b(b"bi-rl/header", canon({k: v for k, v in header.items() if k != "digest"})).hex()


def differing_fields(a, b, prefix: str = "") -> list[str]:
    """Dotted names of the leaves where two nested dicts differ."""
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for k in sorted(set(a) | set(b)):
            out += differing_fields(a.get(k), b.get(k), f"{prefix}{k}.")
        return out
    return [] if a == b else [prefix.rstrip(".")]


# -- the header -------------------------------------------------------------------------------


@dataclass(frozen=True)
class RunSettings:
    """The header's run section: everything that determines the samples (hashed)."""

    model_digest: str  # bi_rl.model.model_digest
    tokenizer_digest: str
    sampler: SamplerConfig  # settings and seed
    n: int  # samples per prompt
    max_tokens: int
    stop_tokens: tuple[int, ...]
    stop_strings: tuple[str, ...]
    prompt_count: int
    prompts_digest: str  # bi_rl.rollout.prompts.prompts_digest

    def to_json(self) -> dict:
        sampler = asdict(self.sampler)
        seed = sampler.pop("seed")
        return {
            "model": {"digest": self.model_digest},
            "tokenizer": {"digest": self.tokenizer_digest},
            "sampler": sampler,
            "seed": seed,
            "n": self.n,
            "max_tokens": self.max_tokens,
            "stop_tokens": list(self.stop_tokens),
            "stop_strings": list(self.stop_strings),
            "prompts": {"count": self.prompt_count, "digest": self.prompts_digest},
        }

    @classmethod
    def from_json(cls, run: dict) -> RunSettings:
        """The settings a run section holds; KeyError, TypeError or ValueError if it cannot."""
        return cls(
            model_digest=run["model"]["digest"],
            tokenizer_digest=run["tokenizer"]["digest"],
            sampler=SamplerConfig(**run["sampler"], seed=run["seed"]),
            n=run["n"],
            max_tokens=run["max_tokens"],
            stop_tokens=tuple(run["stop_tokens"]),
            stop_strings=tuple(run["stop_strings"]),
            prompt_count=run["prompts"]["count"],
            prompts_digest=run["prompts"]["digest"],
        )


@dataclass(frozen=True)
class RunHeader:
    """A log's first line: the run settings (hashed) and the environment (not hashed)."""

    run: RunSettings
    env: Environment

    @cached_property
    def genesis(self) -> str:
        return genesis_hash(self.run.to_json())

    def to_json(self) -> dict:
        header = {
            "format": FORMAT,
            "version": VERSION,
            "run": self.run.to_json(),
            "env": self.env.to_json(),
            "genesis": self.genesis,
        }
        header["digest"] = header_digest(header)
        return header

    @classmethod
    def from_json(cls, h: dict, path="<header>") -> RunHeader:
        """The header a parsed first line holds, checked; LogError (line 1) names what fails:
        format, version, a missing section, the digest, the genesis, then the fields."""
        if h.get("format") != FORMAT:
            raise LogError(path, 1, f"not a bi-rl rollout log (format {h.get('format')!r})")
        if h.get("version") != VERSION:
            raise LogError(
                path, 1, f"unsupported log version {h.get('version')!r} (want {VERSION})"
            )
        for k in ("run", "env", "genesis", "digest"):
            if k not in h:
                raise LogError(path, 1, f"header lacks {k!r}")
        if header_digest(h) != h["digest"]:
            raise LogError(path, 1, "header digest mismatch: the header was edited")
        if genesis_hash(h["run"]) != h["genesis"]:
            raise LogError(path, 1, "genesis hash does not match the header's run section")
        try:
            header = cls(RunSettings.from_json(h["run"]), Environment(**h["env"]))
        except (KeyError, TypeError, ValueError) as e:
            raise LogError(path, 1, f"header fields do not fit version {VERSION}: {e}") from None
        extra = differing_fields(header.to_json(), h)
        if extra:
            raise LogError(
                path, 1, f"header fields do not fit version {VERSION}: {', '.join(extra)}"
            )
        return header


# -- the records ------------------------------------------------------------------------------


@dataclass(frozen=True)
class LogRecord:
    """One sample as a log line holds it; its fields, in order, are the record schema."""

    prompt_index: int
    prompt_id: str
    sample: int
    prompt_tokens: tuple[int, ...]
    tokens: tuple[int, ...]  # completion tokens, stop token included
    logprob_bits: tuple[int, ...]  # float32 bit pattern of each token's logprob
    fingerprints: tuple[int, ...]  # 64-bit fingerprint of each token's logits row
    hashes: tuple[str, ...]  # chained hash after each token
    finish: str  # "stop" or "length"
    stop: int | str | None  # the stop token id or stop string that ended it
    hash: str  # the closing hash, which the next record chains from

    @classmethod
    def chained(cls, sample, prev: str) -> LogRecord:
        """The record of a finished sample (the fields above but the hashes) chained from
        `prev`, the genesis or the previous record's hash."""
        hashes, end = chain_record(prev, sample)
        values = {f: getattr(sample, f) for f in RECORD_FIELDS if f not in CHAIN_FIELDS}
        return cls.from_values({**values, "hashes": hashes, "hash": end})

    @classmethod
    def from_values(cls, values: dict) -> LogRecord:
        return cls(**{k: tuple(v) if isinstance(v, list | tuple) else v for k, v in values.items()})

    def to_json(self) -> dict:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in self.__dict__.items()}

    @classmethod
    def from_json(cls, obj: dict, path="<log>", lineno: int | None = None) -> LogRecord:
        """The record a parsed line holds, its form checked (LogError names the line)."""
        missing = [k for k in RECORD_FIELDS if k not in obj]
        if missing:
            raise LogError(path, lineno, f"record lacks {', '.join(missing)}")
        extra = sorted(k for k in obj if k not in RECORD_FIELDS)
        if extra:
            raise LogError(
                path,
                lineno,
                f"record has fields outside the log format: {', '.join(extra)} (no hash covers "
                "them)",
            )
        n = len(obj["tokens"]) if isinstance(obj["tokens"], list) else -1
        for k, bound in (("tokens", _U32), ("logprob_bits", _U32), ("fingerprints", _U64)):
            v = obj[k]
            if not (isinstance(v, list) and len(v) == n and all(_is_int(x, bound) for x in v)):
                raise LogError(path, lineno, f"{k!r} must be {n} integers in [0, {bound})")
        if not (isinstance(obj["hashes"], list) and len(obj["hashes"]) == n):
            raise LogError(path, lineno, f"'hashes' must hold {n} hex strings")
        pt = obj["prompt_tokens"]
        if not (isinstance(pt, list) and all(_is_int(x, _U32) for x in pt)):
            raise LogError(path, lineno, "'prompt_tokens' must be a list of token ids")
        if not (_is_int(obj["prompt_index"], _U64) and _is_int(obj["sample"], _U64)):
            raise LogError(path, lineno, "'prompt_index' and 'sample' must be integers >= 0")
        if not isinstance(obj["prompt_id"], str) or obj["finish"] not in ("stop", "length"):
            raise LogError(path, lineno, "'prompt_id' must be a string, 'finish' stop or length")
        return cls.from_values({k: obj[k] for k in RECORD_FIELDS})

    @property
    def logprobs(self) -> np.ndarray:
        """The logprobs as float32, bit-exact."""
        return logprobs_from_bits(self.logprob_bits)

    @property
    def label(self) -> str:
        """How a reader names this sample: its prompt id, prompt index and sample index."""
        return sample_label(self.prompt_id, self.prompt_index, self.sample)


def sample_label(prompt_id: str, prompt_index: int, sample: int) -> str:
    return f"prompt {prompt_id!r} (index {prompt_index}), sample {sample}"


RECORD_FIELDS = tuple(f.name for f in fields(LogRecord))
CHAIN_FIELDS = ("hashes", "hash")  # computed by the chain; the rest is the sample's


def _is_int(x, bound) -> bool:
    return type(x) is int and 0 <= x < bound


def chain_record(prev: str, rec) -> tuple[list[str], str]:
    """(per-token hashes, closing hash) of one record chained from `prev` (hex).

    `rec` is a mapping or object with the record's fields other than the hashes.
    """
    g = rec.__getitem__ if isinstance(rec, dict) else lambda k: getattr(rec, k)
    ident = [g("prompt_index"), g("prompt_id"), g("sample"), list(g("prompt_tokens"))]
    h = _b(b"bi-rl/record", bytes.fromhex(prev), canon(ident))
    hashes = []
    pack = struct.Struct("<IIQ").pack
    for t, lp, fp in zip(g("tokens"), g("logprob_bits"), g("fingerprints"), strict=True):
        h = _b(b"bi-rl/token", h, pack(t, lp, fp))
        hashes.append(h.hex())
    end = _b(b"bi-rl/end", h, canon([g("finish"), g("stop"), len(g("tokens"))]))
    return hashes, end.hex()


# -- the sidecar ------------------------------------------------------------------------------


@dataclass(frozen=True)
class RunSummary:
    """One bi-rollout run of a log: how it was scheduled and how long it took."""

    log: str
    records: int  # records in the log when the run ended
    resumed_from: int | None  # records already there when a resumed run began
    generated_tokens: int
    prefill_tokens: int
    seconds: float
    tokens_per_s: float | None
    engine: EngineConfig
    finished_at: str
    ranks: int = 1  # processes that generated (data parallel: bi_rl.dist)
    # Why the run stopped before the log held every record (a rank lost, an error); None
    # when it ended normally. An incomplete log is continued with --resume.
    incomplete: str | None = None

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict) -> RunSummary:
        engine = dict(d["engine"])
        if engine.get("stop_tokens") is not None:
            engine["stop_tokens"] = tuple(engine["stop_tokens"])
        engine["stop_strings"] = tuple(engine.get("stop_strings", ()))
        return cls(**{**d, "engine": EngineConfig(**engine)})


@dataclass(frozen=True)
class Sidecar:
    """LOG.run.json: the runs that wrote a log, oldest first (outside the log and its hash)."""

    runs: tuple[RunSummary, ...] = ()

    @staticmethod
    def path(log) -> Path:
        log = Path(log)
        return log.with_name(log.name + ".run.json")

    @classmethod
    def read(cls, log) -> Sidecar:
        """The sidecar of `log`; empty when it is missing or unreadable. A run entry this
        version cannot read is left out (a sidecar holds facts, never the log's bits)."""
        try:
            data = orjson.loads(cls.path(log).read_bytes())
        except (OSError, orjson.JSONDecodeError):
            return cls()
        entries = data.get("runs", [data]) if isinstance(data, dict) else []
        runs = []
        for entry in entries if isinstance(entries, list) else []:
            try:
                runs.append(RunSummary.from_json(entry))
            except (KeyError, TypeError, ValueError):
                continue
        return cls(tuple(runs))

    def write(self, log) -> None:
        """Write the sidecar whole: aside, then renamed over the old one."""
        data = {"runs": [r.to_json() for r in self.runs]}
        path = self.path(log)
        aside = path.with_name(f".{path.name}.{os.getpid()}.partial")
        aside.write_bytes(orjson.dumps(data, option=orjson.OPT_INDENT_2) + b"\n")
        os.replace(aside, path)

    def batch_sizes(self) -> list[int]:
        """The distinct batch sizes the runs decoded with, in the order first used."""
        out = []
        for r in self.runs:
            if r.engine.batch_size not in out:
                out.append(r.engine.batch_size)
        return out
