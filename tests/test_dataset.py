"""bi_rl.read_dataset and rewards files: logs as training data, rewards checked against them.

Properties: a log becomes a datasets.Dataset with one row per record, in order, whose
logprobs are bitwise the logged float32 values (and whose streaming form yields the same
rows); the cache follows the file (a log rewritten at the same path is read again); a
tampered log is refused naming its line. A rewards file keyed by record hash round-trips
and joins as a column; an unknown hash, a duplicate, a missing record, a non-finite reward
or malformed JSON is refused naming the line or record.
"""

import math

import numpy as np
import orjson
import pytest
from log_tools import ADDITION_ROWS, make_log, read_lines, write_lines
from tiny_models import build_model, write_jsonl

import bi_rl
from bi_rl.rollout.log import LogError, read_log
from bi_rl.score.dataset import FEATURES, RewardsError, read_dataset, read_rewards, write_rewards


@pytest.fixture(scope="module")
def log(tmp_path_factory):
    root = tmp_path_factory.mktemp("dataset")
    model = build_model(root / "model", hidden=32)
    prompts = write_jsonl(root / "prompts.jsonl", ADDITION_ROWS)
    return make_log(root / "run.jsonl", model, prompts, n=2, max_tokens=5, limit=3)


def test_rows_are_the_records_with_exact_logprobs(log, tmp_path):
    _, records = read_log(log)
    ds = bi_rl.read_dataset(log, cache_dir=str(tmp_path))
    assert ds.column_names == list(FEATURES) and len(ds) == len(records)
    assert str(ds.features["logprobs"].feature.dtype) == "float32"
    for row, rec in zip(ds, records, strict=True):
        assert row["hash"] == rec.hash and row["prompt_id"] == rec.prompt_id
        assert row["tokens"] == list(rec.tokens) and row["prompt_tokens"] == list(rec.prompt_tokens)
        got = np.array(row["logprobs"], np.float32).view(np.uint32)
        assert np.array_equal(got, np.array(rec.logprob_bits, np.uint32))
        assert row["finish"] == rec.finish
        assert row["stop_token"] == (rec.stop if isinstance(rec.stop, int) else None)
    streamed = list(read_dataset(log, streaming=True))
    assert [r["hash"] for r in streamed] == ds["hash"]
    for a, b in zip(streamed, ds, strict=True):
        assert np.array_equal(
            np.array(a["logprobs"], np.float32), np.array(b["logprobs"], np.float32)
        )


def test_the_cache_follows_the_file(log, tmp_path):
    copy = tmp_path / "copy.jsonl"
    lines = read_lines(log)
    write_lines(copy, lines[:3])
    assert len(read_dataset(copy, cache_dir=str(tmp_path / "c"))) == 2
    write_lines(copy, lines)
    assert len(read_dataset(copy, cache_dir=str(tmp_path / "c"))) == len(lines) - 1


def test_a_tampered_log_is_refused(log, tmp_path):
    lines = read_lines(log)
    rec = orjson.loads(lines[2])
    rec["logprob_bits"][0] ^= 1
    bad = write_lines(
        tmp_path / "bad.jsonl",
        [*lines[:2], orjson.dumps(rec, option=orjson.OPT_SORT_KEYS) + b"\n", *lines[3:]],
    )
    with pytest.raises(LogError, match=r"bad.jsonl:3: token 0: hash chain broken"):
        read_dataset(bad, cache_dir=str(tmp_path))
    with pytest.raises(LogError, match=r"bad.jsonl:3: token 0: hash chain broken"):
        list(read_dataset(bad, streaming=True))
    with pytest.raises(LogError, match="no such log"):
        read_dataset(tmp_path / "missing.jsonl")


def test_rewards_round_trip_and_join(log, tmp_path):
    _, records = read_log(log)
    hashes = [r.hash for r in records]
    rewards = [0.5 * i for i in range(len(records))]
    path = write_rewards(tmp_path / "r.jsonl", hashes[::-1], rewards[::-1])  # any order
    assert read_rewards(path, log) == rewards
    ds = read_dataset(log, rewards=path, cache_dir=str(tmp_path))
    assert ds["reward"] == rewards
    with pytest.raises(RewardsError, match="already exists"):
        write_rewards(path, hashes, rewards)


def _rewards(tmp_path, rows) -> object:
    path = tmp_path / "r.jsonl"
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    return path


def test_bad_rewards_files_are_named(log, tmp_path):
    _, records = read_log(log)
    good = [{"hash": r.hash, "reward": 1.0} for r in records]
    cases = [
        (
            good + [{"hash": "00" * 16, "reward": 1.0}],
            rf":{len(good) + 1}: hash 0+ is not a record",
        ),
        (
            good + [good[1]],
            rf":{len(good) + 1}: duplicate reward for hash {good[1]['hash']} "
            r"\(first on line 2\)",
        ),
        (
            good[:1] + good[2:],
            rf"r.jsonl: 1 of {len(good)} records of .*run.jsonl have no reward; "
            rf"the first is record 1 \(prompt 'q0' \(index 0\), sample 1, hash "
            rf"{good[1]['hash']}\)",
        ),
        ([{**good[0], "reward": math.nan}, *good[1:]], ":1: reward must be a finite number"),
        ([{**good[0], "reward": "1"}, *good[1:]], ":1: reward must be a finite number"),
        ([{"reward": 1.0}, *good[1:]], ':1: expected {"hash"'),
    ]
    for rows, pattern in cases:
        with pytest.raises(RewardsError, match=pattern):
            read_rewards(_rewards(tmp_path, rows), log)
    path = tmp_path / "r.jsonl"
    path.write_bytes(b"{not json\n")
    with pytest.raises(RewardsError, match=":1: not valid JSON"):
        read_rewards(path, log)
    assert read_rewards(_rewards(tmp_path, good), log) == [1.0] * len(good), "guard: good file"
