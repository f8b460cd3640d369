"""bi_rl.rollout.schema: the typed header, the record schema, the sidecar and the version.

Properties: every committed log's header reads into a RunHeader and writes back to the same
bytes; a header field this version does not know is refused even with its digest and genesis
resealed; the hashed fields of each format version are pinned, so a new sampler setting
(which would change every new log's genesis) fails here until VERSION is bumped; the module
docstring, the writer, the reader and the engine's Sample agree on the record's fields; the
sidecar reads back what it wrote and tolerates what it cannot read.
"""

import re
from dataclasses import dataclass, fields, replace
from pathlib import Path

import orjson
import pytest
from log_tools import committed_logs, reseal_header

from bi_rl.model import Environment
from bi_rl.rollout import schema
from bi_rl.rollout.engine import EngineConfig, Sample
from bi_rl.rollout.log import read_header
from bi_rl.rollout.sampler import SamplerConfig
from bi_rl.rollout.schema import (
    CHAIN_FIELDS,
    RECORD_FIELDS,
    VERSION,
    LogError,
    LogRecord,
    RunHeader,
    RunSettings,
    RunSummary,
    Sidecar,
    canon,
)

ROOT = Path(__file__).resolve().parent.parent
LOGS = committed_logs(ROOT)

# The key paths of the run section, the input of the genesis hash, per format version. A
# change to them is a change of every new log's hashes: bump VERSION and pin the new set.
HASHED = {
    1: [
        "max_tokens",
        "model.digest",
        "n",
        "prompts.count",
        "prompts.digest",
        "sampler.min_p",
        "sampler.temperature",
        "sampler.top_k",
        "sampler.top_p",
        "seed",
        "stop_strings",
        "stop_tokens",
        "tokenizer.digest",
    ],
}


def _paths(d: dict, prefix="") -> list[str]:
    out = []
    for k, v in d.items():
        out += _paths(v, f"{prefix}{k}.") if isinstance(v, dict) else [prefix + k]
    return sorted(out)


def _settings(sampler=None) -> RunSettings:
    return RunSettings(
        model_digest="m",
        tokenizer_digest="t",
        sampler=sampler or SamplerConfig(),
        n=1,
        max_tokens=4,
        stop_tokens=(2,),
        stop_strings=(),
        prompt_count=1,
        prompts_digest="p",
    )


ENV = Environment("m", "0.1.0", "0.32.4", "0.32.2", "3.11.7", "linux-x86_64", "cpu", "x", "strict")


@pytest.mark.parametrize("path", LOGS, ids=[p.name for p in LOGS])
def test_committed_headers_read_and_write_back_byte_for_byte(path):
    header = read_header(path)
    first = path.read_bytes().split(b"\n", 1)[0]
    assert canon(header.to_json()) == first
    assert RunHeader.from_json(orjson.loads(first)) == header
    assert header.genesis == orjson.loads(first)["genesis"]


def test_the_attention_split_is_in_env_only_where_recorded():
    """env's attention_split (the CUDA attention kernels' keys a split): absent from the JSON
    where None (other backends, and logs made before it was recorded, which read back as
    None and write back byte for byte), present where set; outside the hash chain either way."""
    assert "attention_split" not in ENV.to_json()
    cuda = replace(ENV, backend="cuda", attention_split=512)
    assert cuda.to_json()["attention_split"] == 512
    for env in (ENV, cuda):
        h = RunHeader(_settings(), env)
        assert RunHeader.from_json(orjson.loads(canon(h.to_json()))) == h
    assert RunHeader(_settings(), cuda).genesis == RunHeader(_settings(), ENV).genesis


def test_a_process_records_its_split_on_cuda_alone(monkeypatch):
    """bi_rl.model.environment records the split size (bi_rl._split) where the CUDA backend
    serves, the size the process runs (BI_RL_ATTN_SPLIT or the default), and none elsewhere."""
    import bi_rl.backends as backends
    from bi_rl import _split
    from bi_rl.model import environment

    monkeypatch.delenv(_split.SPLIT_ENV, raising=False)
    assert environment("m", "strict").attention_split is None  # this CPU's backend

    class Cuda:
        name = "cuda"

    monkeypatch.setattr(backends, "active", lambda: Cuda)
    assert environment("m", "strict").attention_split == _split.KEYS_PER_SPLIT
    monkeypatch.setenv(_split.SPLIT_ENV, "1024")
    assert environment("m", "strict").attention_split == 1024


def test_a_header_round_trips_through_its_json():
    header = RunHeader(_settings(SamplerConfig(0.5, 0.9, 3, 0.01, seed=2**64 - 1)), ENV)
    again = RunHeader.from_json(orjson.loads(canon(header.to_json())))
    assert again == header and again.genesis == header.genesis


def test_the_hashed_fields_are_pinned_for_this_version():
    assert VERSION in HASHED, f"format version {VERSION} has no pinned hashed fields"
    assert _paths(_settings().to_json()) == HASHED[VERSION], (
        "the run section's fields changed: this changes the genesis hash of every new log; "
        "bump bi_rl.rollout.schema.VERSION and pin the new fields here"
    )


def test_a_new_sampler_setting_would_be_caught():
    """Negative control: a sampler with one more setting enters the hash (its genesis moves)
    and so fails the pin above; nothing can change the hashed fields silently."""

    @dataclass(frozen=True)
    class Extended(SamplerConfig):
        repetition_penalty: float = 1.0

    plain, extended = _settings(), _settings(Extended())
    assert _paths(extended.to_json()) != HASHED[VERSION]
    assert schema.genesis_hash(extended.to_json()) != schema.genesis_hash(plain.to_json())


def test_a_header_this_version_does_not_know_is_refused():
    h = RunHeader(_settings(), ENV).to_json()
    h["run"]["sampler"]["repetition_penalty"] = 1.0
    with pytest.raises(LogError, match="do not fit version 1"):
        RunHeader.from_json(reseal_header(h, genesis=True))
    h = RunHeader(_settings(), ENV).to_json()
    h["env"]["gpu_clock"] = 1980
    with pytest.raises(LogError, match="do not fit version 1"):
        RunHeader.from_json(reseal_header(h))
    h = RunHeader(_settings(), ENV).to_json()
    del h["run"]["n"]
    with pytest.raises(LogError, match="do not fit version 1: 'n'"):
        RunHeader.from_json(reseal_header(h, genesis=True))


def _quoted(text: str) -> list[str]:
    return re.findall(r'"(\w+)"', text)


def _keys(d: dict) -> list[str]:
    """Every key of a nested dict, depth first, in order."""
    return [x for k, v in d.items() for x in [k, *(_keys(v) if isinstance(v, dict) else [])]]


def test_the_docstring_lists_exactly_the_schema_fields():
    doc = schema.__doc__
    records = doc[doc.index("Then one line per finished sample") : doc.index("The chain (")]
    assert re.findall(r'"(\w+)":', records.split("::", 1)[1]) == list(RECORD_FIELDS)
    run = doc[doc.index("run (`RunSettings`)") : doc.index('"sampler" and "seed" are')]
    assert _quoted(run) == _keys(_settings().to_json())
    env = doc[doc.index("env (`") : doc.index("The chain leaves env out")]
    assert _quoted(env) == [f.name for f in fields(Environment)]


def test_a_sample_holds_the_record_fields_but_the_chain():
    assert [f.name for f in fields(Sample)] == [f for f in RECORD_FIELDS if f not in CHAIN_FIELDS]


@pytest.mark.parametrize("missing", RECORD_FIELDS)
def test_a_record_line_lacking_a_field_names_it(missing):
    s = Sample(0, "p", 0, (1, 2), [3], [0x3F800000], [5], "stop", 3)
    obj = LogRecord.chained(s, "00" * 16).to_json()
    assert LogRecord.from_json(obj).hash == obj["hash"]
    del obj[missing]
    with pytest.raises(LogError, match=f"record lacks {missing}"):
        LogRecord.from_json(obj, "x.jsonl", 2)


def _summary(batch_size: int, **kw) -> RunSummary:
    values = dict(
        log="a.jsonl",
        records=4,
        resumed_from=None,
        generated_tokens=10,
        prefill_tokens=6,
        seconds=0.5,
        tokens_per_s=20.0,
        engine=EngineConfig(batch_size=batch_size, stop_tokens=(2,), stop_strings=("==",)),
        finished_at="2026-11-30T12:00:00+0000",
    )
    return RunSummary(**{**values, **kw})


def test_the_sidecar_reads_back_what_it_wrote(tmp_path):
    log = tmp_path / "a.jsonl"
    assert Sidecar.read(log) == Sidecar(), "no sidecar: no runs"
    side = Sidecar((_summary(8), _summary(5, resumed_from=2), _summary(8)))
    side.write(log)
    assert Sidecar.path(log) == tmp_path / "a.jsonl.run.json"
    assert Sidecar.read(log) == side
    assert side.batch_sizes() == [8, 5]


def test_the_sidecar_tolerates_what_it_cannot_read(tmp_path):
    log = tmp_path / "a.jsonl"
    Sidecar.path(log).write_bytes(b"{not json")
    assert Sidecar.read(log) == Sidecar()
    one = _summary(3).to_json()
    Sidecar.path(log).write_bytes(orjson.dumps(one))  # an older sidecar: one run, no list
    assert Sidecar.read(log).batch_sizes() == [3]
    bad = replace(_summary(4)).to_json()
    bad["engine"]["batch_size"] = 0
    Sidecar.path(log).write_bytes(orjson.dumps({"runs": [bad, one, "junk"]}))
    assert Sidecar.read(log).batch_sizes() == [3], "entries it cannot read are left out"


def test_max_record_bytes_bounds_the_longest_record():
    """max_record_bytes is an upper bound on a record's line (LF included) even at the
    widest values: every id at its maximum, an id and a stop string of escaped characters."""
    from bi_rl.rollout.schema import max_record_bytes

    for k, prompt_len in ((0, 1), (1, 3), (50, 200)):
        pid, stop = "\x01\u2028é" * 7, '"\\\x02' * 5
        sample = Sample(
            prompt_index=2**64 - 1,
            prompt_id=pid,
            sample=2**64 - 1,
            prompt_tokens=(2**32 - 1,) * prompt_len,
            tokens=[2**32 - 1] * k,
            logprob_bits=[2**32 - 1] * k,
            fingerprints=[2**64 - 1] * k,
            finish="stop",
            stop=stop,
        )
        line = canon(LogRecord.chained(sample, "0" * 32).to_json()) + b"\n"
        assert len(line) <= max_record_bytes(prompt_len, k, pid, (stop,)), (k, len(line))
