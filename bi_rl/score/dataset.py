"""Rollout logs as training data, and rewards keyed by record hash.

    ds = bi_rl.read_dataset("rollouts/run.jsonl")              # a datasets.Dataset
    ds = bi_rl.read_dataset(LOG, streaming=True)                # a datasets.IterableDataset
    ds = bi_rl.read_dataset(LOG, rewards="rewards.jsonl")       # plus a checked reward column

One row per sample, in log order. Columns (`FEATURES`): prompt_index, prompt_id, sample,
prompt_tokens, tokens (the completion as logged: a stop token that ended it is its last
token, with its logprob), logprobs (float32, bitwise the logged values), finish ("stop" or
"length"), stop_token and stop_string (what ended it, or None), and hash (the record's
closing hash in the chain: its identity, and the key of a rewards file).

Reading checks the header and every record's hash chain as it goes (bi_rl.rollout.schema), so
an edited or truncated log raises LogError naming the line. Nothing holds the whole log in
memory: the Dataset is built by `datasets.Dataset.from_generator`, which writes an Arrow
cache on disk (under `cache_dir`, else the `datasets` default) keyed by the log's path,
size, modification time and header digest, so a changed log is read again; with
`streaming=True` records are read from the file only as they are iterated.

Rewards file: JSON Lines, one {"hash": hex, "reward": number} per record of the log.
`read_rewards(path, log)` returns the rewards in log order after checking that every line
is well formed, every hash is a record of the log, no hash comes twice, no record is
missing and every reward is a finite number; each problem is a RewardsError naming the
line (or the missing record). `write_rewards` writes such a file, never over another.

Invariant kept: logs are only read; logprobs cross into Arrow as float32, never rounded.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from pathlib import Path

import orjson

from bi_rl.rollout.log import iter_records, read_header
from bi_rl.rollout.schema import LogError, LogRecord

__all__ = [
    "FEATURES",
    "RewardsError",
    "dataset_row",
    "features",
    "read_dataset",
    "read_rewards",
    "write_rewards",
]

# Column name -> datasets feature spec (built by `features()`, so importing this is cheap).
FEATURES = {
    "prompt_index": "int64",
    "prompt_id": "string",
    "sample": "int64",
    "prompt_tokens": ["int64"],
    "tokens": ["int64"],
    "logprobs": ["float32"],
    "finish": "string",
    "stop_token": "int64",
    "stop_string": "string",
    "hash": "string",
}


class RewardsError(ValueError):
    """A rewards file that does not fit its log; the message names the line or record."""


def features(with_reward: bool = False):
    """The datasets.Features of a log's rows (plus a float64 "reward" column)."""
    import datasets

    spec = dict(FEATURES, **({"reward": "float64"} if with_reward else {}))
    return datasets.Features(
        {
            k: datasets.List(datasets.Value(v[0])) if isinstance(v, list) else datasets.Value(v)
            for k, v in spec.items()
        }
    )


def dataset_row(rec: LogRecord) -> dict:
    """One log record as a dataset row (the columns of FEATURES)."""
    return {
        "prompt_index": rec.prompt_index,
        "prompt_id": rec.prompt_id,
        "sample": rec.sample,
        "prompt_tokens": list(rec.prompt_tokens),
        "tokens": list(rec.tokens),
        "logprobs": rec.logprobs.tolist(),
        "finish": rec.finish,
        "stop_token": rec.stop if isinstance(rec.stop, int) else None,
        "stop_string": rec.stop if isinstance(rec.stop, str) else None,
        "hash": rec.hash,
    }


def _rows(path: str, rewards: dict | None = None, **_key) -> Iterator[dict]:
    """The generator behind the datasets (`_key` only keys their cache)."""
    for rec in iter_records(path, verify=True):
        row = dataset_row(rec)
        if rewards is not None:
            row["reward"] = rewards[rec.hash]
        yield row


def read_dataset(
    log,
    *,
    rewards=None,
    streaming: bool = False,
    cache_dir: str | None = None,
    keep_in_memory: bool = False,
):
    """The log's samples as a datasets.Dataset (or IterableDataset with streaming=True).

    rewards: a rewards file (JSON Lines keyed by record hash), checked against the log
    before anything is read into the dataset; adds a "reward" column.
    """
    import datasets

    path = Path(log)
    header = read_header(path)  # LogError: missing file, bad header
    reward_map = None
    if rewards is not None:
        hashes = [r.hash for r in iter_records(path, verify=True)]
        reward_map = dict(zip(hashes, read_rewards(rewards, hashes=hashes), strict=True))
    feats = features(with_reward=reward_map is not None)
    kwargs = {"path": str(path), "rewards": reward_map}
    if streaming:
        return datasets.IterableDataset.from_generator(_rows, features=feats, gen_kwargs=kwargs)
    st = path.stat()
    kwargs.update(size=st.st_size, mtime=st.st_mtime_ns, digest=header.to_json()["digest"])
    try:
        return datasets.Dataset.from_generator(
            _rows,
            features=feats,
            gen_kwargs=kwargs,
            cache_dir=cache_dir,
            keep_in_memory=keep_in_memory,
        )
    except datasets.exceptions.DatasetGenerationError as e:
        cause = e.__cause__
        while cause is not None and not isinstance(cause, LogError):
            cause = cause.__cause__
        if cause is None:
            raise
        raise cause from None  # the log's own one-line error, not the builder's wrapper


def _log_hashes(log) -> tuple[list[str], list[str]]:
    labels, hashes = [], []
    for r in iter_records(log, verify=True):
        labels.append(r.label)
        hashes.append(r.hash)
    return hashes, labels


def read_rewards(path, log=None, *, hashes: Sequence[str] | None = None) -> list[float]:
    """Rewards from `path`, in the record order of `log` (or of `hashes`), fully checked."""
    if (log is None) == (hashes is None):
        raise TypeError("read_rewards needs a log or its record hashes (exactly one)")
    labels = None
    if log is not None:
        hashes, labels = _log_hashes(log)
    index = {h: i for i, h in enumerate(hashes)}
    where = str(log) if log is not None else "the log"
    path = Path(path)
    if not path.is_file():
        raise RewardsError(f"{path}: no such rewards file")
    got: dict[str, tuple[float, int]] = {}
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, start=1):
            if not raw.strip():
                continue
            try:
                obj = orjson.loads(raw)
            except orjson.JSONDecodeError as e:
                raise RewardsError(f"{path}:{lineno}: not valid JSON ({e.msg})") from None
            if not (isinstance(obj, dict) and isinstance(obj.get("hash"), str)):
                raise RewardsError(f'{path}:{lineno}: expected {{"hash": hex, "reward": number}}')
            h, r = obj["hash"], obj.get("reward")
            if not (type(r) in (int, float) and math.isfinite(r)):
                raise RewardsError(f"{path}:{lineno}: reward must be a finite number, got {r!r}")
            if h not in index:
                raise RewardsError(f"{path}:{lineno}: hash {h} is not a record of {where}")
            if h in got:
                raise RewardsError(
                    f"{path}:{lineno}: duplicate reward for hash {h} (first on line {got[h][1]})"
                )
            got[h] = (float(r), lineno)
    missing = [i for i, h in enumerate(hashes) if h not in got]
    if missing:
        first = missing[0]
        name = labels[first] if labels else f"record {first}"
        raise RewardsError(
            f"{path}: {len(missing)} of {len(hashes)} records of {where} have no reward; the "
            f"first is record {first} ({name}, hash {hashes[first]})"
        )
    return [got[h][0] for h in hashes]


def write_rewards(path, hashes: Sequence[str], rewards: Sequence[float]) -> Path:
    """Write a rewards file (one line per hash, in order); refuses an existing file."""
    if len(hashes) != len(rewards):
        raise RewardsError(f"{len(hashes)} hashes vs {len(rewards)} rewards")
    for h, r in zip(hashes, rewards, strict=True):
        if not math.isfinite(float(r)):
            raise RewardsError(f"reward for hash {h} is not finite ({r})")
    path = Path(path)
    lines = b"".join(
        orjson.dumps({"hash": h, "reward": float(r)}) + b"\n"
        for h, r in zip(hashes, rewards, strict=True)
    )
    try:
        with open(path, "xb") as f:
            f.write(lines)
    except FileExistsError:
        raise RewardsError(f"{path} already exists; choose another path") from None
    return path
