"""Prompt sets: rows from JSONL / JSON / CSV / Parquet / a saved `datasets` directory, tokenized.

A prompt row carries a text field (default "prompt"), or a list of chat messages
({"role", "content"}) in that field, and optionally an id field (default "id"; without one,
a row's id is its 0-based index in the file). Ids must be unique: they key each sample's
randomness, so a prompt keeps its samples wherever it sits in the file.

Tokenization: when the tokenizer has a chat template (and it is not turned off), a text
becomes one user message and the template is applied with the generation prompt added;
otherwise the text is encoded as is. The prompt order of the file is the run's canonical
order, the order of records in the log.

Every problem raises PromptError with a one-line message naming the file and the fix. A
tokenizer that drops characters it does not know (or maps them to a special token) would
change prompts silently: loading warns once (PromptWarning) naming those characters, and
leaves the tokens as the tokenizer made them.
"""

from __future__ import annotations

import csv
import hashlib
import warnings
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import orjson

__all__ = [
    "Prompt",
    "PromptError",
    "PromptWarning",
    "dropped_characters",
    "encode_prompt",
    "load_prompts",
    "prompts_digest",
    "read_rows",
]


@dataclass(frozen=True)
class Prompt:
    """A tokenized prompt; `id` is unique in a run and keys its samples' randomness."""

    id: str
    tokens: tuple[int, ...]


class PromptError(ValueError):
    """The prompt set cannot be used; the message says why and what to do."""


class PromptWarning(UserWarning):
    """The prompt set can be used, but the model will not see it exactly as written."""


def _rows_jsonl(path: Path) -> list[dict]:
    rows = []
    with open(path, "rb") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                rows.append(orjson.loads(line))
            except orjson.JSONDecodeError as e:
                raise PromptError(f"{path}:{lineno}: not valid JSON ({e.msg})") from None
    return rows


def _rows_json(path: Path) -> list[dict]:
    try:
        data = orjson.loads(path.read_bytes())
    except orjson.JSONDecodeError as e:
        raise PromptError(f"{path}: not valid JSON ({e.msg})") from None
    if not isinstance(data, list):
        raise PromptError(f"{path}: expected a JSON list of objects (or use JSON Lines)")
    return data


def _rows_csv(path: Path) -> list[dict]:
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def _rows_parquet(path: Path) -> list[dict]:
    import pyarrow.parquet as pq

    try:
        return pq.read_table(path).to_pylist()
    except Exception as e:  # pyarrow raises several types for a bad file
        raise PromptError(f"{path}: cannot read as Parquet ({e})") from None


def _rows_dataset(path: Path, split: str | None) -> list[dict]:
    import datasets

    try:
        ds = datasets.load_from_disk(str(path))
    except Exception as e:
        raise PromptError(f"{path}: not a saved `datasets` directory ({e})") from None
    if isinstance(ds, datasets.DatasetDict):
        if split is None:
            if len(ds) != 1:
                raise PromptError(f"{path}: holds splits {', '.join(ds)}; choose one with --split")
            split = next(iter(ds))
        if split not in ds:
            raise PromptError(f"{path}: no split {split!r}; it has {', '.join(ds)}")
        ds = ds[split]
    return ds.to_list()


def read_rows(path, split: str | None = None) -> list[dict]:
    """The rows of a prompt file or saved dataset directory, as dicts, in file order."""
    path = Path(path)
    if not path.exists():
        raise PromptError(f"{path}: no such prompt file or directory")
    if path.is_dir():
        rows = _rows_dataset(path, split)
    else:
        suffix = path.suffix.lower()
        readers = {
            ".jsonl": _rows_jsonl,
            ".ndjson": _rows_jsonl,
            ".json": _rows_json,
            ".csv": _rows_csv,
            ".parquet": _rows_parquet,
        }
        if suffix not in readers:
            raise PromptError(
                f"{path}: unknown prompt file type {suffix!r}; use .jsonl, .json, .csv, "
                ".parquet or a saved datasets directory"
            )
        rows = readers[suffix](path)
    for i, r in enumerate(rows):
        if not isinstance(r, dict):
            raise PromptError(f"{path}: row {i} is not an object")
    return rows


def encode_prompt(tokenizer, value, chat_template: bool | None = None) -> tuple[int, ...]:
    """Token ids for one prompt value (a string, or a list of chat messages).

    chat_template: None applies the tokenizer's template when it has one; True requires it.
    """
    has = bool(getattr(tokenizer, "has_chat_template", False))
    if chat_template and not has:
        raise PromptError("the tokenizer has no chat template (drop --chat-template)")
    use = has if chat_template is None else chat_template
    if isinstance(value, list):
        if not use:
            raise PromptError("a prompt is a list of chat messages but no chat template is used")
        messages = value
    elif isinstance(value, str):
        if not use:
            return tuple(tokenizer.encode(value))
        messages = [{"role": "user", "content": value}]
    else:
        raise PromptError(
            f"a prompt must be text or a list of messages, got {type(value).__name__}"
        )
    return tuple(tokenizer.apply_chat_template(messages, add_generation_prompt=True))


def dropped_characters(tokenizer, value) -> Counter:
    """The characters of a prompt's text (or its messages' contents) that its tokens do not
    hold: text minus the text its tokens decode to (special tokens skipped), by count."""
    texts = [value] if isinstance(value, str) else []
    if isinstance(value, list):
        texts = [
            m["content"] for m in value if isinstance(m, dict) and isinstance(m.get("content"), str)
        ]
    missing = Counter()
    for text in texts:
        decoded = tokenizer.decode(tokenizer.encode(text), skip_special_tokens=True)
        missing += Counter(text) - Counter(decoded)
    return missing


def _warn_dropped(dropped: Counter, ids: list[str], total: int) -> None:
    chars = sorted(dropped)
    shown = ", ".join(repr(c) for c in chars[:20])
    if len(chars) > 20:
        shown += f" and {len(chars) - 20} more"
    warnings.warn(
        f"the tokenizer drops characters it does not know: {shown} (in {len(ids)} of {total} "
        f"prompts, first {ids[0]!r}); the model never sees them",
        PromptWarning,
        stacklevel=3,
    )


def load_prompts(
    path,
    tokenizer,
    *,
    field: str = "prompt",
    id_field: str = "id",
    split: str | None = None,
    chat_template: bool | None = None,
    limit: int | None = None,
) -> list[Prompt]:
    """Read and tokenize a prompt set; ids fall back to the row index where id_field is absent."""
    rows = read_rows(path, split)
    if limit is not None:
        rows = rows[:limit]
    if not rows:
        raise PromptError(f"{path}: the prompt set is empty")
    if field not in rows[0]:
        have = ", ".join(map(str, rows[0])) or "none"
        raise PromptError(
            f"{path}: no field {field!r} (fields: {have}); choose one with --prompt-field"
        )
    prompts, seen = [], set()
    dropped, dropped_in = Counter(), []
    for i, row in enumerate(rows):
        if row.get(field) is None:
            raise PromptError(f"{path}: row {i} has no {field!r}")
        pid = str(row[id_field]) if row.get(id_field) is not None else str(i)
        if pid in seen:
            raise PromptError(f"{path}: duplicate prompt id {pid!r} (ids must be unique)")
        seen.add(pid)
        try:
            tokens = encode_prompt(tokenizer, row[field], chat_template)
        except PromptError as e:
            raise PromptError(f"{path}: row {i}: {e}") from None
        if not tokens:
            raise PromptError(f"{path}: row {i} ({pid!r}) encodes to no tokens")
        missing = dropped_characters(tokenizer, row[field])
        if missing:
            dropped += missing
            dropped_in.append(pid)
        prompts.append(Prompt(id=pid, tokens=tokens))
    if dropped:
        _warn_dropped(dropped, dropped_in, len(rows))
    return prompts


def prompts_digest(prompts) -> str:
    """blake2b-128 of the (id, tokens) list: what the log header records of the prompt set."""
    data = orjson.dumps([[p.id, list(p.tokens)] for p in prompts])
    return hashlib.blake2b(data, digest_size=16, person=b"bi-rl/prompts").hexdigest()
