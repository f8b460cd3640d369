"""The rollout log: an append-only, hash-chained JSONL record of every sampled token.

Format (version 1). One JSON object per line, UTF-8, written with orjson (sorted keys):

Line 1, the header::

    {"format": "bi-rl.rollout", "version": 1,
     "run": {...},     # what determines the samples; hashed into the chain's genesis
     "env": {...},     # where and with what they were made; not in the chain
     "genesis": hex,   # genesis_hash(run)
     "digest": hex}    # header_digest(header): blake2b-128 of the header without "digest"

  run: {"model": {"digest"}, "tokenizer": {"digest"}, "sampler": {"temperature", "top_p",
  "top_k", "min_p"}, "seed", "n", "max_tokens", "stop_tokens", "stop_strings",
  "prompts": {"count", "digest"}}. env: {"model_path", "bi_rl", "mlx", "mlx_lm", "python",
  "platform", "backend", "device", "invariant_mode"}. The chain leaves env out, so logs made
  on two machines or backends with bitwise-equal samples have equal hashes, and
  `bi-audit A B` can compare them token for token.

Then one line per finished sample, in canonical order (prompt_index, then sample)::

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

Writing is append-only and flushed after every batch of records. A run killed mid-way is
continued with `open_for_resume`, which drops a torn last line, checks the header, verifies
the chain, and returns where to continue; the finished file is byte-identical to an
uninterrupted run. Run-specific facts (batch size, timings, throughput) never enter the log:
they go to a sidecar file (`sidecar_path`).

Reader API: `read_header(path)`, `iter_records(path, verify=True)`, `read_log(path)` and
`LogError` (names the line, and the token where it applies); `chain_record` recomputes the
hashes of one record.
"""

from __future__ import annotations

import hashlib
import os
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import orjson

__all__ = [
    "FORMAT",
    "VERSION",
    "LogError",
    "LogRecord",
    "LogWriter",
    "chain_record",
    "genesis_hash",
    "header_digest",
    "iter_records",
    "make_header",
    "open_for_resume",
    "read_header",
    "read_log",
    "sidecar_path",
]

FORMAT = "bi-rl.rollout"
VERSION = 1
_OPT = orjson.OPT_SORT_KEYS
RECORD_FIELDS = (
    "prompt_index", "prompt_id", "sample", "prompt_tokens", "tokens", "logprob_bits",
    "fingerprints", "hashes", "finish", "stop", "hash",
)  # fmt: skip
_U32, _U64 = 1 << 32, 1 << 64


class LogError(ValueError):
    """A log that is malformed, truncated or fails its chain; names the line and token."""

    def __init__(self, path, line: int | None, message: str, token: int | None = None):
        self.path, self.line, self.token = str(path), line, token
        where = str(path) if line is None else f"{path}:{line}"
        if token is not None:
            where += f": token {token}"
        super().__init__(f"{where}: {message}")


def _canon(x) -> bytes:
    return orjson.dumps(x, option=_OPT)


def _b(person: bytes, *parts: bytes) -> bytes:
    h = hashlib.blake2b(digest_size=16, person=person)
    for p in parts:
        h.update(p)
    return h.digest()


def genesis_hash(run: dict) -> str:
    """The chain's starting hash, from the header's run section."""
    return _b(b"bi-rl/genesis", _canon(run)).hex()


def header_digest(header: dict) -> str:
    """blake2b-128 of the canonical header without its own "digest" field."""
    return _b(b"bi-rl/header", _canon({k: v for k, v in header.items() if k != "digest"})).hex()


def make_header(run: dict, env: dict) -> dict:
    header = {"format": FORMAT, "version": VERSION, "run": run, "env": env}
    header["genesis"] = genesis_hash(run)
    header["digest"] = header_digest(header)
    return header


def chain_record(prev: str, rec) -> tuple[list[str], str]:
    """(per-token hashes, closing hash) of one record chained from `prev` (hex).

    `rec` is a mapping or object with prompt_index, prompt_id, sample, prompt_tokens,
    tokens, logprob_bits, fingerprints, finish, stop.
    """
    g = rec.__getitem__ if isinstance(rec, dict) else lambda k: getattr(rec, k)
    ident = [g("prompt_index"), g("prompt_id"), g("sample"), list(g("prompt_tokens"))]
    h = _b(b"bi-rl/record", bytes.fromhex(prev), _canon(ident))
    hashes = []
    pack = struct.Struct("<IIQ").pack
    for t, lp, fp in zip(g("tokens"), g("logprob_bits"), g("fingerprints"), strict=True):
        h = _b(b"bi-rl/token", h, pack(t, lp, fp))
        hashes.append(h.hex())
    end = _b(b"bi-rl/end", h, _canon([g("finish"), g("stop"), len(g("tokens"))]))
    return hashes, end.hex()


@dataclass(frozen=True)
class LogRecord:
    """One sample as read back from a log."""

    prompt_index: int
    prompt_id: str
    sample: int
    prompt_tokens: tuple[int, ...]
    tokens: tuple[int, ...]
    logprob_bits: tuple[int, ...]
    fingerprints: tuple[int, ...]
    hashes: tuple[str, ...]
    finish: str
    stop: int | str | None
    hash: str

    @property
    def logprobs(self) -> np.ndarray:
        """The logprobs as float32, bit-exact."""
        return np.array(self.logprob_bits, dtype=np.uint32).view(np.float32)

    def to_json(self) -> dict:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in self.__dict__.items()}


def _record_line(sample, prev: str) -> tuple[bytes, str]:
    hashes, end = chain_record(prev, sample)
    rec = {
        "prompt_index": sample.prompt_index,
        "prompt_id": sample.prompt_id,
        "sample": sample.sample,
        "prompt_tokens": list(sample.prompt_tokens),
        "tokens": list(sample.tokens),
        "logprob_bits": list(sample.logprob_bits),
        "fingerprints": list(sample.fingerprints),
        "hashes": hashes,
        "finish": sample.finish,
        "stop": sample.stop,
        "hash": end,
    }
    return _canon(rec) + b"\n", end


# -- reading ------------------------------------------------------------------------------


def _parse(path, lineno: int, raw: bytes) -> dict:
    try:
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        raise LogError(path, lineno, f"not valid JSON ({e.msg})") from None
    if not isinstance(obj, dict):
        raise LogError(path, lineno, "expected a JSON object")
    return obj


def _check_header(path, h: dict) -> dict:
    if h.get("format") != FORMAT:
        raise LogError(path, 1, f"not a bi-rl rollout log (format {h.get('format')!r})")
    if h.get("version") != VERSION:
        raise LogError(path, 1, f"unsupported log version {h.get('version')!r} (want {VERSION})")
    for k in ("run", "env", "genesis", "digest"):
        if k not in h:
            raise LogError(path, 1, f"header lacks {k!r}")
    if header_digest(h) != h["digest"]:
        raise LogError(path, 1, "header digest mismatch: the header was edited")
    if genesis_hash(h["run"]) != h["genesis"]:
        raise LogError(path, 1, "genesis hash does not match the header's run section")
    return h


def _is_int(x, bound) -> bool:
    return type(x) is int and 0 <= x < bound


def _to_record(path, lineno: int, obj: dict) -> LogRecord:
    missing = [k for k in RECORD_FIELDS if k not in obj]
    if missing:
        raise LogError(path, lineno, f"record lacks {', '.join(missing)}")
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
    return LogRecord(**{k: tuple(v) if isinstance(v, list) else v for k, v in obj.items()
                        if k in RECORD_FIELDS})  # fmt: skip


def _verify(path, lineno: int, rec: LogRecord, prev: str) -> None:
    hashes, end = chain_record(prev, rec)
    for i, (want, got) in enumerate(zip(hashes, rec.hashes, strict=True)):
        if want != got:
            raise LogError(path, lineno, "hash chain broken", token=i)
    if end != rec.hash:
        raise LogError(path, lineno, "record hash does not close the chain")


def _lines(path) -> Iterator[tuple[int, bytes, bool]]:
    """(line number, bytes, complete) for each line; only the last may be incomplete."""
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, start=1):
            yield lineno, raw, raw.endswith(b"\n")


def read_header(path) -> dict:
    """The header of the log at `path`, checked (format, version, digest, genesis)."""
    path = Path(path)
    if not path.is_file():
        raise LogError(path, None, "no such log file")
    for lineno, raw, complete in _lines(path):
        if not complete:
            raise LogError(path, lineno, "truncated header line")
        return _check_header(path, _parse(path, lineno, raw))
    raise LogError(path, None, "empty log")


def iter_records(path, *, verify: bool = True, allow_torn: bool = False) -> Iterator[LogRecord]:
    """Yield the log's records in order, checking form and (with verify) the hash chain.

    A last line without its newline is a torn write: an error unless allow_torn, in which
    case it is skipped. Raises LogError naming the first bad line (and token).
    """
    header = read_header(path)
    prev = header["genesis"]
    for lineno, raw, complete in _lines(path):
        if lineno == 1:
            continue
        if not complete:
            if allow_torn:
                return
            raise LogError(path, lineno, "truncated last line (the run was killed mid-write)")
        rec = _to_record(path, lineno, _parse(path, lineno, raw))
        if verify:
            _verify(path, lineno, rec, prev)
        prev = rec.hash
        yield rec


def read_log(path, *, verify: bool = True) -> tuple[dict, list[LogRecord]]:
    """(header, records) of a complete log."""
    return read_header(path), list(iter_records(path, verify=verify))


def sidecar_path(path) -> Path:
    """Where run-specific facts (batch size, timings) are written beside the log."""
    path = Path(path)
    return path.with_name(path.name + ".run.json")


# -- writing ------------------------------------------------------------------------------


class LogWriter:
    """Appends chained records to a log file; `write` flushes each batch."""

    def __init__(self, path, header: dict, *, prev: str | None = None, count: int = 0):
        self.path = Path(path)
        self.header = header
        self.count = count
        if prev is None:
            with open(self.path, "xb") as f:
                f.write(_canon(header) + b"\n")
            prev = header["genesis"]
        self.prev = prev
        self._f = open(self.path, "ab")  # noqa: SIM115 - closed in close()

    def write(self, samples) -> None:
        """Append samples (in canonical order) and flush them to the OS."""
        if not samples:
            return
        buf = bytearray()
        for s in samples:
            line, self.prev = _record_line(s, self.prev)
            buf += line
        self._f.write(buf)
        self._f.flush()
        self.count += len(samples)

    def close(self) -> None:
        if not self._f.closed:
            self._f.flush()
            os.fsync(self._f.fileno())
            self._f.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _differences(a, b, prefix="") -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for k in sorted(set(a) | set(b)):
            out += _differences(a.get(k), b.get(k), f"{prefix}{k}.")
        return out
    return [] if a == b else [prefix.rstrip(".")]


def open_for_resume(path, header: dict, *, ignore_env=("model_path",)) -> LogWriter:
    """A writer continuing the log at `path`, which an identical run started.

    Drops a torn last line, refuses a header that differs from `header` (naming the fields;
    env fields in `ignore_env` may differ), verifies every record's chain and that records
    are the canonical prefix, and returns a writer positioned after them (`.count` records
    done). A missing or empty file starts a new log.
    """
    path = Path(path)
    if not path.exists() or path.stat().st_size == 0:
        if path.exists():
            path.unlink()
        return LogWriter(path, header)
    with open(path, "rb") as f:
        data = f.read()
    cut = data.rfind(b"\n") + 1
    if cut == 0:
        raise LogError(path, 1, "truncated header line; remove the file to start again")
    old = read_header(path)
    strip = lambda h: {**h, "env": {k: v for k, v in h["env"].items() if k not in ignore_env}}
    diff = _differences(strip(old), strip(header))
    diff = [d for d in diff if d not in ("digest", "genesis")]  # derived fields
    if diff:
        raise LogError(path, 1, f"cannot resume: header differs in {', '.join(diff)}")
    if cut < len(data):
        with open(path, "r+b") as f:
            f.truncate(cut)
    prev, count = old["genesis"], 0
    n = old["run"]["n"]
    for rec in iter_records(path):
        if (rec.prompt_index, rec.sample) != divmod(count, n):
            raise LogError(path, count + 2, "records are not in canonical order")
        prev = rec.hash
        count += 1
    return LogWriter(path, old, prev=prev, count=count)
