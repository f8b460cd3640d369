"""bi_rl.rollout.log: exact round trip, a hash chain that locates every tamper, resume.

Properties: logprob bit patterns (including -0.0, subnormals, -inf, NaN payloads) and 64-bit
fingerprints survive writing and reading; each single-bit change of a token, logprob or
fingerprint, a dropped, duplicated or reordered record, a truncated last line and an
edited header are detected and named by line (and token); a log resumed after a torn
write is byte-identical to one written in one go; a mismatched header is refused. Readers
take only the writer's exact bytes (LF, orjson sorted keys) and the format's fields, read at
most MAX_LINE_BYTES of a line (both sides of the limit, allocation measured), and name a
last line that lacks only its LF; resume refuses a missing, empty or CRLF log untouched; a
new log appears at its path only with its first records.
"""

import struct
from dataclasses import replace

import numpy as np
import orjson
import pytest

from bi_rl.model import Environment
from bi_rl.rollout.engine import Sample
from bi_rl.rollout.log import (
    LogError,
    LogWriter,
    iter_records,
    open_for_resume,
    read_header,
    read_log,
)
from bi_rl.rollout.sampler import SamplerConfig
from bi_rl.rollout.schema import RunHeader, RunSettings, chain_record, header_digest

RUN = RunSettings(
    model_digest="m",
    tokenizer_digest="t",
    sampler=SamplerConfig(seed=1),
    n=2,
    max_tokens=7,
    stop_tokens=(7,),
    stop_strings=("###",),
    prompt_count=3,
    prompts_digest="p",
)
ENV = Environment(
    model_path="/models/x",
    bi_rl="0.1.0",
    mlx="0.32.4",
    mlx_lm="0.32.2",
    python="3.11.7",
    platform="linux-x86_64",
    backend="cpu",
    device="test",
    invariant_mode="strict",
)

SPECIAL_F32 = [0.0, -0.0, 1e-45, -1e-40, float("-inf"), -3.5]


def _bits(xs):
    return [struct.unpack("<I", struct.pack("<f", x))[0] for x in xs]


def _samples(count=6, n=2):
    rng = np.random.default_rng(0)
    out = []
    for u in range(count):
        k = int(rng.integers(1, 7))
        bits = _bits(rng.normal(size=k).astype(np.float32).tolist())
        if u == 0:
            bits = _bits(SPECIAL_F32) + [0x7FC00001]  # a NaN with a payload
            k = len(bits)
        out.append(
            Sample(
                prompt_index=u // n,
                prompt_id=f"id-{u // n}",
                sample=u % n,
                prompt_tokens=tuple(int(t) for t in rng.integers(0, 100, size=3)),
                tokens=[int(t) for t in rng.integers(0, 2**32, size=k, dtype=np.uint64)],
                logprob_bits=bits,
                fingerprints=[2**64 - 1] + [int(x) for x in rng.integers(0, 2**63, size=k - 1)],
                finish="stop" if u % 3 else "length",
                stop=None if u % 3 == 0 else (7 if u % 3 == 1 else "###"),
            )
        )
    return out


def _write(path, samples, batches=(2, 1, 3)):
    header = RunHeader(RUN, ENV)
    with LogWriter(path, header) as w:
        i = 0
        for b in batches:
            w.write(samples[i : i + b])
            i += b
        w.write(samples[i:])
    return header


def _full_and_part(tmp_path, torn: bool, name: str = "part.jsonl"):
    """(samples, header, full, part): `full` the whole log of `_samples()`, `part` the same
    run's first 3 records, and with `torn` the first 25 bytes of the 4th record after them
    (a write killed mid-line)."""
    samples = _samples()
    full = tmp_path / "full.jsonl"
    header = _write(full, samples)
    part = tmp_path / name
    with LogWriter(part, header) as w:
        w.write(samples[:3])
    if torn:
        part.write_bytes(part.read_bytes() + full.read_bytes().splitlines(keepends=True)[4][:25])
    return samples, header, full, part


def test_round_trip_is_exact(tmp_path):
    samples = _samples()
    header = _write(tmp_path / "a.jsonl", samples)
    got_header, records = read_log(tmp_path / "a.jsonl")
    assert got_header == header
    assert len(records) == len(samples)
    for s, r in zip(samples, records, strict=True):
        assert (r.prompt_index, r.prompt_id, r.sample) == (s.prompt_index, s.prompt_id, s.sample)
        assert list(r.tokens) == s.tokens and list(r.fingerprints) == s.fingerprints
        assert list(r.logprob_bits) == s.logprob_bits
        assert r.logprobs.view(np.uint32).tolist() == s.logprob_bits
        assert (r.finish, r.stop) == (s.finish, s.stop)
    assert np.signbit(records[0].logprobs[1]) and records[0].logprobs[4] == -np.inf


def test_log_bytes_do_not_depend_on_how_records_were_batched(tmp_path):
    samples = _samples()
    _write(tmp_path / "a.jsonl", samples, batches=(1, 1, 1))
    _write(tmp_path / "b.jsonl", samples, batches=(6,))
    assert (tmp_path / "a.jsonl").read_bytes() == (tmp_path / "b.jsonl").read_bytes()


def test_background_writer_writes_the_same_bytes(tmp_path):
    """A writer thread hashing and writing, with the header known only later, produces the
    bytes the generating thread would have written itself."""
    import threading

    samples = _samples()
    _write(tmp_path / "a.jsonl", samples)
    ready = threading.Event()

    def header():  # as a run's header waits for its digests
        ready.wait()
        return RunHeader(RUN, ENV)

    with LogWriter(tmp_path / "b.jsonl", header, background=True) as w:
        try:
            w.write(samples[:2])
            w.write(samples[2:5])
            assert w.submitted == 5 and w.count == 0, "handed over, nothing written yet"
            assert not (tmp_path / "b.jsonl").exists(), "no log in place before its header"
        finally:
            ready.set()
        w.write(samples[5:])
    assert w.count == w.submitted == 6
    assert (tmp_path / "b.jsonl").read_bytes() == (tmp_path / "a.jsonl").read_bytes()


def test_background_writer_reports_its_failure(tmp_path):
    def header():
        raise OSError("disk gone")

    w = LogWriter(tmp_path / "a.jsonl", header, background=True)
    w._thread.join()  # the thread has failed
    with pytest.raises(OSError, match="disk gone"):
        w.write(_samples()[:1])
    with pytest.raises(OSError, match="disk gone"):
        w.close()


def test_background_resume_is_byte_identical(tmp_path):
    samples = _samples()
    _write(tmp_path / "full.jsonl", samples)
    part = tmp_path / "part.jsonl"
    _write(part, samples[:3], batches=())
    with open_for_resume(part, RunHeader(RUN, ENV), background=True) as w:
        assert w.count == 3
        w.write(samples[3:])
    assert part.read_bytes() == (tmp_path / "full.jsonl").read_bytes()


def _lines(path):
    return path.read_bytes().splitlines(keepends=True)


def _tamper_field(path, lineno, field, index, bit):
    lines = _lines(path)
    rec = orjson.loads(lines[lineno - 1])
    rec[field][index] ^= 1 << bit
    lines[lineno - 1] = orjson.dumps(rec, option=orjson.OPT_SORT_KEYS) + b"\n"
    path.write_bytes(b"".join(lines))


@pytest.mark.parametrize(
    "field,index,bit",
    [
        ("logprob_bits", 2, 0),
        ("logprob_bits", 0, 31),
        ("tokens", 1, 5),
        ("fingerprints", 3, 63),
        ("fingerprints", 0, 0),
    ],
)
def test_a_flipped_bit_is_located(tmp_path, field, index, bit):
    path = tmp_path / "a.jsonl"
    _write(path, _samples())
    _tamper_field(path, 2, field, index, bit)
    with pytest.raises(LogError) as e:
        read_log(path)
    assert (e.value.line, e.value.token) == (2, index)
    assert f"{path}:2: token {index}: hash chain broken" in str(e.value)


def _expect(path, line, match):
    with pytest.raises(LogError, match=match) as e:
        read_log(path)
    assert e.value.line == line
    return e.value


def test_dropped_duplicated_reordered_records_are_located(tmp_path):
    path = tmp_path / "a.jsonl"
    _write(path, _samples())
    orig = _lines(path)
    path.write_bytes(b"".join(orig[:3] + orig[4:]))  # drop record 3 (line 4)
    _expect(path, 4, "hash chain broken|does not close")
    path.write_bytes(b"".join(orig[:4] + orig[3:]))  # duplicate line 4
    _expect(path, 5, "hash chain broken|does not close")
    path.write_bytes(b"".join(orig[:2] + [orig[3], orig[2]] + orig[4:]))  # swap lines 3, 4
    _expect(path, 3, "hash chain broken|does not close")


def test_finish_or_stop_edits_break_the_closing_hash(tmp_path):
    path = tmp_path / "a.jsonl"
    _write(path, _samples())
    lines = _lines(path)
    rec = orjson.loads(lines[2])
    rec["finish"] = "length" if rec["finish"] == "stop" else "stop"
    lines[2] = orjson.dumps(rec, option=orjson.OPT_SORT_KEYS) + b"\n"
    path.write_bytes(b"".join(lines))
    _expect(path, 3, "does not close")


def test_truncated_last_line_and_malformed_lines(tmp_path):
    path = tmp_path / "a.jsonl"
    _write(path, _samples())
    data = path.read_bytes()
    path.write_bytes(data[:-20])
    _expect(path, 7, "truncated last line")
    assert len(list(iter_records(path, allow_torn=True))) == 5
    path.write_bytes(data + b"{not json\n")
    _expect(path, 8, "not valid JSON")
    path.write_bytes(data + b'{"tokens": [1]}\n')
    _expect(path, 8, "record lacks")
    lines = data.splitlines(keepends=True)
    rec = orjson.loads(lines[1])
    rec["logprob_bits"] = rec["logprob_bits"][:-1]
    path.write_bytes(lines[0] + orjson.dumps(rec) + b"\n")
    _expect(path, 2, "'logprob_bits' must be")


def test_edited_header_is_detected(tmp_path):
    path = tmp_path / "a.jsonl"
    _write(path, _samples())
    lines = _lines(path)
    h = orjson.loads(lines[0])
    h["env"]["mlx"] = "9.9.9"
    path.write_bytes(orjson.dumps(h) + b"\n" + b"".join(lines[1:]))
    _expect(path, 1, "header digest mismatch")
    h = orjson.loads(lines[0])
    h["run"]["seed"] = 2
    h["digest"] = header_digest(h)  # a careful forger fixes the digest; the genesis still fails
    path.write_bytes(orjson.dumps(h) + b"\n" + b"".join(lines[1:]))
    _expect(path, 1, "genesis")
    path.write_bytes(b'{"format": "something else"}\n')
    _expect(path, 1, "not a bi-rl rollout log")
    path.write_bytes(b"")
    with pytest.raises(LogError, match="empty log"):
        read_header(path)
    with pytest.raises(LogError, match="no such log"):
        read_header(tmp_path / "missing.jsonl")


def test_chain_starts_at_the_genesis_and_links_records(tmp_path):
    samples = _samples()
    header = _write(tmp_path / "a.jsonl", samples)
    _, records = read_log(tmp_path / "a.jsonl")
    prev = header.genesis
    for s, r in zip(samples, records, strict=True):
        hashes, end = chain_record(prev, s)
        assert hashes == list(r.hashes) and end == r.hash
        prev = end


def test_resume_after_a_torn_write_is_byte_identical(tmp_path):
    samples, header, full, part = _full_and_part(tmp_path, torn=True)
    w = open_for_resume(part, RunHeader(RUN, replace(ENV, model_path="elsewhere/x")))
    assert w.count == 3
    with w:
        w.write(samples[3:])
    assert part.read_bytes() == full.read_bytes()


def test_resume_refuses_a_different_run(tmp_path):
    path = tmp_path / "a.jsonl"
    _write(path, _samples()[:2])
    with pytest.raises(LogError, match=r"header differs in run\.seed"):
        open_for_resume(path, RunHeader(replace(RUN, sampler=SamplerConfig(seed=9)), ENV))
    with pytest.raises(LogError, match=r"env\.mlx"):
        open_for_resume(path, RunHeader(RUN, replace(ENV, mlx="0.0.1")))


def test_resume_refuses_another_attention_split(tmp_path):
    """The CUDA attention kernels' split size sets the bits, so a log made at one size is not
    continued at another (records at two sizes would rescore at neither), nor a log that
    predates the record (absent: None) by a process that records one; the same size goes on."""
    cuda = replace(ENV, backend="cuda", attention_split=256)
    path = tmp_path / "a.jsonl"
    with LogWriter(path, RunHeader(RUN, cuda)) as w:
        w.write(_samples()[:2])
    before = path.read_bytes()
    with pytest.raises(LogError, match=r"header differs in env\.attention_split"):
        open_for_resume(path, RunHeader(RUN, replace(cuda, attention_split=512)))
    old = tmp_path / "old.jsonl"
    with LogWriter(old, RunHeader(RUN, replace(cuda, attention_split=None))) as w:
        w.write(_samples()[:2])
    with pytest.raises(LogError, match=r"header differs in env\.attention_split"):
        open_for_resume(old, RunHeader(RUN, cuda))
    assert path.read_bytes() == before
    with open_for_resume(path, RunHeader(RUN, cuda)) as w:
        assert w.count == 2


def test_resume_refuses_non_canonical_records(tmp_path):
    samples = _samples()
    path = tmp_path / "a.jsonl"
    header = RunHeader(RUN, ENV)
    with LogWriter(path, header) as w:
        w.write([samples[1], samples[0]])
    with pytest.raises(LogError, match="canonical order"):
        open_for_resume(path, header)


def test_writer_never_overwrites(tmp_path):
    path = tmp_path / "a.jsonl"
    _write(path, _samples()[:1])
    with pytest.raises(FileExistsError):
        LogWriter(path, RunHeader(RUN, ENV))


# -- the canonical byte form, unknown fields, bounded lines ----------------------------------


def test_a_record_with_fields_outside_the_format_is_refused(tmp_path):
    """The chain covers the record's known fields only, so an added field (a reward, a text)
    would be unverified data a reader of the JSONL still sees: it is refused, named."""
    path = tmp_path / "a.jsonl"
    _write(path, _samples())
    lines = _lines(path)
    rec = orjson.loads(lines[3])
    rec.update(reward=1.0, text="forged text")
    lines[3] = orjson.dumps(rec, option=orjson.OPT_SORT_KEYS) + b"\n"
    path.write_bytes(b"".join(lines))
    _expect(path, 4, "fields outside the log format: reward, text")


def test_only_the_canonical_byte_form_is_read(tmp_path):
    """A log line is exactly the writer's bytes: orjson with sorted keys, no spaces, LF. CRLF
    line ends and re-formatted JSON (same values, so the chain still holds) are refused on the
    line they occur, for the header and for records alike."""
    path = tmp_path / "a.jsonl"
    _write(path, _samples())
    good = path.read_bytes()
    lines = _lines(path)
    path.write_bytes(good.replace(b"\n", b"\r\n"))
    _expect(path, 1, "ends in CR LF")
    path.write_bytes(b"".join(lines[:4]) + lines[4].replace(b"\n", b"\r\n") + b"".join(lines[5:]))
    _expect(path, 5, "ends in CR LF")
    spaced = orjson.dumps(orjson.loads(lines[2]), option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS)
    path.write_bytes(b"".join(lines[:2]) + spaced.replace(b"\n", b"") + b"\n" + b"".join(lines[3:]))
    _expect(path, 3, "not the writer's exact JSON")
    unsorted = orjson.dumps(dict(reversed(list(orjson.loads(lines[0]).items())))) + b"\n"
    path.write_bytes(unsorted + b"".join(lines[1:]))
    _expect(path, 1, "not the writer's exact JSON")
    path.write_bytes(good)
    assert len(read_log(path)[1]) == 6


def test_a_last_line_missing_only_its_newline_is_named_as_such(tmp_path):
    """A complete last record without its LF is not a torn write; it is named as what it is."""
    path = tmp_path / "a.jsonl"
    _write(path, _samples())
    good = path.read_bytes()
    path.write_bytes(good[:-1])
    _expect(path, 7, "lacks its final newline")
    with pytest.raises(LogError) as e:
        read_log(path)
    assert "killed" not in str(e.value)
    path.write_bytes(good[:-9])
    _expect(path, 7, "truncated last line")


def test_a_line_over_the_size_limit_is_refused_without_reading_it(tmp_path, monkeypatch):
    """Memory per line is bounded: a line longer than MAX_LINE_BYTES is refused after reading
    at most that many bytes (both sides of the limit); reading a 16 MiB line with a 1 MiB
    limit allocates a few MiB at most."""
    import tracemalloc

    from bi_rl.rollout import log, schema

    path = tmp_path / "a.jsonl"
    _write(path, _samples())
    lines = _lines(path)
    longest = max(len(x) for x in lines)
    monkeypatch.setattr(schema, "MAX_LINE_BYTES", longest)
    assert len(read_log(path)[1]) == 6  # a line of exactly the limit (LF included) is read
    monkeypatch.setattr(schema, "MAX_LINE_BYTES", longest - 1)
    with pytest.raises(LogError, match="longer than the limit") as e:
        read_log(path)
    assert "\n" not in str(e.value)
    monkeypatch.setattr(schema, "MAX_LINE_BYTES", 1 << 20)
    big = tmp_path / "big.jsonl"
    big.write_bytes(lines[0] + b'{"tokens": [' + b"1," * (8 << 20) + b"1]}\n")
    tracemalloc.start()
    try:
        with pytest.raises(LogError, match=r"big.jsonl:2: .*longer than the limit of 1048576"):
            list(log.iter_records(big))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 << 20, f"reading the long line allocated {peak} bytes"


def test_resume_of_a_missing_or_empty_log_is_refused(tmp_path):
    """--resume needs a log: a missing or empty file is an error, and stays as it was."""
    with pytest.raises(LogError, match="no such file: nothing to resume"):
        open_for_resume(tmp_path / "new.jsonl", RunHeader(RUN, ENV))
    assert not (tmp_path / "new.jsonl").exists()
    (tmp_path / "empty.jsonl").write_bytes(b"")
    with pytest.raises(LogError, match="is empty: nothing to resume"):
        open_for_resume(tmp_path / "empty.jsonl", RunHeader(RUN, ENV))
    assert (tmp_path / "empty.jsonl").read_bytes() == b""


def test_resume_refuses_a_crlf_log_and_leaves_it_as_it_was(tmp_path):
    """Resuming never mixes line ends: a CRLF log (with a torn tail) is refused untouched."""
    path = tmp_path / "a.jsonl"
    samples = _samples()
    header = _write(path, samples[:3], batches=())
    data = path.read_bytes().replace(b"\n", b"\r\n") + b'{"prompt_in'
    path.write_bytes(data)
    with pytest.raises(LogError, match="CR LF"):
        open_for_resume(path, header)
    assert path.read_bytes() == data


def test_a_new_log_appears_only_with_its_first_records(tmp_path):
    """LogWriter writes a new log aside and puts it in place with its first records; closed
    (or failed) before any record, it leaves nothing; it never replaces a log unless asked."""
    path = tmp_path / "a.jsonl"
    header = RunHeader(RUN, ENV)
    w = LogWriter(path, header)
    assert not path.exists() and len(list(tmp_path.iterdir())) == 1
    w.close()
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(RuntimeError), LogWriter(path, header):
        raise RuntimeError("the run failed")
    assert list(tmp_path.iterdir()) == []
    path.write_bytes(b"old")
    with LogWriter(path, header, replace=True) as w:
        assert path.read_bytes() == b"old"
        w.write(_samples()[:1])
        assert path.read_bytes().startswith(b'{"digest"')
    assert [p.name for p in tmp_path.iterdir()] == ["a.jsonl"]


# -- one writer per log (bi_rl._lock) --------------------------------------------------------


def _elsewhere(path) -> bool:
    """held_elsewhere as another process sees it (this one's own locks are not 'elsewhere')."""
    import subprocess
    import sys

    code = "import sys; from bi_rl import _lock; print(_lock.held_elsewhere(sys.argv[1]))"
    out = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, check=True)
    return out.stdout.strip() == b"True"


def test_a_log_being_written_is_locked_from_aside_to_close(tmp_path):
    """The aside file's lock is the log's once renamed into place, and goes with close."""
    from bi_rl import _lock

    samples = _samples()
    path = tmp_path / "a.jsonl"
    w = LogWriter(path, RunHeader(RUN, ENV))
    w.write(samples[:2])
    assert w.in_place and _elsewhere(path)
    assert not _lock.held_elsewhere(path)  # this process's own lock
    w.write(samples[2:])
    w.close()
    assert not _elsewhere(path)
    read_log(path)


def test_a_second_writer_is_refused_and_the_log_kept(tmp_path, held):
    """While another process writes a log: resuming it, replacing it and a reader's verdict
    on its half-written last line all say so; the log, torn line included, keeps every byte.
    Once that process is gone the same torn line reads as a killed run and resumes."""
    samples, header, full, path = _full_and_part(tmp_path, torn=True, name="a.jsonl")
    before = path.read_bytes()
    holder = held(path)
    with pytest.raises(LogError, match="another process is writing this log"):
        open_for_resume(path, header)
    with pytest.raises(LogError, match="another process is writing this log"):
        w = LogWriter(path, header, replace=True)
        w.write(samples[:1])
        w.close()
    with pytest.raises(LogError, match="last line is being written: another process"):
        read_log(path)
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []
    holder.stdin.close()
    holder.wait(timeout=30)
    with pytest.raises(LogError, match="killed mid-write"):
        read_log(path)
    with open_for_resume(path, header) as w:
        w.write(samples[3:])
    assert path.read_bytes() == full.read_bytes()


def test_a_filesystem_without_locks_writes_unlocked(tmp_path, monkeypatch):
    """Where flock fails with anything but "held" (ENOLCK on some network mounts), a log is
    written and resumed as before locks existed, and nothing reads as held."""
    import errno

    from bi_rl import _lock

    def no_locks(fd, op):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(_lock.fcntl, "flock", no_locks)
    samples, header, full, path = _full_and_part(tmp_path, torn=False, name="a.jsonl")
    assert not _lock.held_elsewhere(path)
    with open_for_resume(path, header) as w:
        w.write(samples[3:])
    assert path.read_bytes() == full.read_bytes()
