"""bi_rl.score.audit: every tamper is caught and located; two logs compare by hash.

Properties: an untouched log verifies; each tamper (a logprob bit, a token, a fingerprint,
a prompt token, a stored hash, a finish reason, a dropped, duplicated, reordered or
appended record, a dropped last record, a truncated last line, an edited header, with or
without a recomputed digest and genesis) is reported at the right line, record and token;
a sample of a thousand random single-bit flips anywhere in the file, and every bit of one
logprob, are all caught on the flipped line; malformed files give a Problem, never an
exception. A forger who recomputes the whole chain passes the model-free audit but not
re-derivation with the model, which names the record and token. Two logs of one run made
with different batch sizes compare identical; a forged one differs at the forged token;
different settings are named. Fields outside the format, CR LF line ends, re-formatted JSON,
a missing final LF and an over-long line (read in bounded memory) each fail the audit on
their line.
"""

import mlx_lm
import numpy as np
import pytest
from log_tools import (
    ADDITION_ROWS,
    dump,
    load,
    make_log,
    read_lines,
    rechain,
    reseal_header,
    write_lines,
)
from tiny_models import build_model, write_jsonl

from bi_rl.score.audit import audit_log, compare_logs, rederive

RECORDS = 8  # 4 prompts x n = 2


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("audit")
    model = build_model(root / "model")
    prompts = write_jsonl(root / "prompts.jsonl", ADDITION_ROWS)
    log = make_log(root / "a.jsonl", model, prompts)
    return root, model, prompts, log


def _tampered(setup, tmp_path, edit):
    lines = read_lines(setup[3])
    return write_lines(tmp_path / "t.jsonl", edit(lines))


def _edit_record(i, fn):
    def edit(lines):
        rec = load(lines[i + 1])
        fn(rec)
        lines[i + 1] = dump(rec)
        return lines

    return edit


def _flip(field, j, bit=0):
    def fn(rec):
        rec[field][j] ^= 1 << bit

    return fn


def _edit_header(fn, **reseal):
    def edit(lines):
        h = load(lines[0])
        fn(h)
        if reseal:
            reseal_header(h, **reseal)
        lines[0] = dump(h)
        return lines

    return edit


def _set_temperature(h):
    h["run"]["sampler"]["temperature"] = 0.5


TAMPERS = {
    # name: (edit, line, record, token, message)
    "logprob low bit": (_edit_record(3, _flip("logprob_bits", 2)), 5, 3, 2, "hash chain broken"),
    "logprob sign bit": (_edit_record(3, _flip("logprob_bits", 4, 31)), 5, 3, 4, "chain broken"),
    "token": (_edit_record(4, _flip("tokens", 1)), 6, 4, 1, "hash chain broken"),
    "fingerprint bit": (_edit_record(0, _flip("fingerprints", 0, 63)), 2, 0, 0, "chain broken"),
    "prompt token": (_edit_record(2, _flip("prompt_tokens", 0)), 4, 2, 0, "hash chain broken"),
    "prompt id": (_edit_record(2, lambda r: r.update(prompt_id="zz")), 4, 2, 0, "chain broken"),
    "stored hash": (
        _edit_record(6, lambda r: r["hashes"].__setitem__(3, "0" * 32)),
        8,
        6,
        3,
        "chain broken",
    ),
    "closing hash": (
        _edit_record(1, lambda r: r.update(hash="f" * 32)),
        3,
        1,
        None,
        "does not close",
    ),
    "finish reason": (
        _edit_record(1, lambda r: r.update(finish="stop", stop=1)),
        3,
        1,
        None,
        "does not close",
    ),
    "dropped record": (lambda ls: ls[:4] + ls[5:], 5, 3, 0, "hash chain broken"),
    "dropped last record": (lambda ls: ls[:-1], 9, 7, None, "ends early: 7 records"),
    "duplicated record": (lambda ls: ls[:5] + [ls[4]] + ls[5:], 6, 4, 0, "hash chain broken"),
    "reordered records": (lambda ls: ls[:4] + [ls[5], ls[4]] + ls[6:], 5, 3, 0, "chain broken"),
    "appended copy": (lambda ls: ls + [ls[-1]], 10, 8, 0, "hash chain broken"),
    "truncated last line": (lambda ls: ls[:-1] + [ls[-1][:-9]], 9, 7, None, "truncated last"),
    "torn mid-line": (lambda ls: ls[:-1] + [ls[-1][:40] + b"\n"], 9, 7, None, "not valid JSON"),
    "header edit": (_edit_header(_set_temperature), 1, None, None, "header digest mismatch"),
    "header edit, digest resealed": (
        _edit_header(_set_temperature, genesis=False),
        1,
        None,
        None,
        "genesis",
    ),
    "header edit, digest and genesis resealed": (
        _edit_header(_set_temperature, genesis=True),
        2,
        0,
        0,
        "hash chain broken",
    ),
}


def test_untouched_log_verifies(setup):
    res = audit_log(setup[3])
    assert res.ok, res.summary()
    assert res.records == res.expected_records == RECORDS and res.tokens > 0
    assert "OK: 8 records" in res.summary()


@pytest.mark.parametrize("name", list(TAMPERS))
def test_each_tamper_is_detected_and_located(setup, tmp_path, name):
    edit, line, record, token, message = TAMPERS[name]
    path = _tampered(setup, tmp_path, edit)
    assert path.read_bytes() != setup[3].read_bytes(), "the tamper must change the file"
    res = audit_log(path)
    assert not res.ok, f"{name} went undetected"
    p = res.problem
    assert (p.line, p.record, p.token) == (line, record, token), res.summary()
    assert message in p.message, res.summary()
    assert "\n" not in res.summary()


def test_random_single_bit_flips_are_all_caught_on_their_line(setup, tmp_path):
    data = setup[3].read_bytes()
    starts = np.cumsum([0] + [len(x) for x in read_lines(setup[3])])
    rng = np.random.default_rng(0)
    path = tmp_path / "flip.jsonl"
    positions = rng.integers(0, len(data) * 8, size=1000)
    for pos in positions:
        byte, bit = divmod(int(pos), 8)
        b = bytearray(data)
        b[byte] ^= 1 << bit
        path.write_bytes(bytes(b))
        res = audit_log(path)
        line = int(np.searchsorted(starts, byte, side="right"))
        assert not res.ok, f"flip of bit {bit} of byte {byte} (line {line}) went undetected"
        assert res.problem.line == line, f"byte {byte} bit {bit}: {res.summary()}"


def test_every_bit_of_a_logprob_is_covered(setup, tmp_path):
    for bit in range(32):
        path = _tampered(setup, tmp_path, _edit_record(4, _flip("logprob_bits", 1, bit)))
        p = audit_log(path).problem
        assert p is not None and (p.line, p.record, p.token) == (6, 4, 1), f"bit {bit}"


@pytest.mark.parametrize(
    "content,message",
    [
        (None, "no such log file"),
        (b"", "empty log"),
        (b"\x00\xff\xfe garbage\n", "not valid JSON"),
        (b"[1, 2]\n", "expected a JSON object"),
        (b'{"format": "something else"}\n', "not a bi-rl rollout log"),
        (b'{"format": "bi-rl.rollout", "version": 1}', "header line lacks its final newline"),
        (b'{"format": "bi-rl.rollout", "vers', "truncated header"),
        (b'{"format": "bi-rl.rollout", "version": 99}\n', "unsupported log version"),
    ],
)
def test_malformed_files_give_a_problem_not_an_exception(tmp_path, content, message):
    path = tmp_path / "bad.jsonl"
    if content is not None:
        path.write_bytes(content)
    res = audit_log(path)
    assert not res.ok and message in res.problem.message, res.summary()
    assert "\n" not in res.summary()


def test_header_only_log_ends_early(setup, tmp_path):
    path = _tampered(setup, tmp_path, lambda ls: ls[:1])
    p = audit_log(path).problem
    assert "ends early: 0 records" in p.message and p.line == 2


def test_record_with_bad_fields_is_named(setup, tmp_path):
    path = _tampered(setup, tmp_path, _edit_record(2, lambda r: r.update(tokens="oops")))
    p = audit_log(path).problem
    assert p.line == 4 and p.record == 2 and "'tokens'" in p.message
    path = _tampered(setup, tmp_path, _edit_record(2, lambda r: r.pop("hashes")))
    assert "lacks hashes" in audit_log(path).problem.message


def test_rechained_forgery_passes_the_chain_but_not_rederivation(setup, tmp_path):
    _, model_dir, _, log = setup

    def forge(lines):
        rec = load(lines[4])  # record 3
        rec["logprob_bits"][2] ^= 1
        lines[4] = dump(rec)
        return rechain(lines)

    path = _tampered(setup, tmp_path, forge)
    assert audit_log(path).ok, "a fully rechained forgery is invisible without the model"
    model, tok = mlx_lm.load(str(model_dir))
    good = rederive(log, model, tok, batch_size=3)
    assert good.ok and good.tokens_equal == good.tokens
    bad = rederive(path, model, tok, batch_size=3)
    assert not bad.ok and bad.first_token_mismatch is None  # the token itself was not forged
    d = bad.report.first_divergence
    assert (d.sample, d.position) == (3, 2) and bad.report.differing == 1


def test_rederivation_catches_a_forged_token(setup, tmp_path):
    def forge(lines):
        rec = load(lines[3])  # record 2
        rec["tokens"][1] = (rec["tokens"][1] + 1) % 40 + 4
        lines[3] = dump(rec)
        return rechain(lines)

    path = _tampered(setup, tmp_path, forge)
    model, tok = mlx_lm.load(str(setup[1]))
    res = rederive(path, model, tok)
    m = res.first_token_mismatch
    assert not res.ok and (m["record"], m["token"], m["line"]) == (2, 1, 4)


def test_two_logs_of_one_run_compare_identical(setup, tmp_path):
    _, model, prompts, log = setup
    other = make_log(tmp_path / "b.jsonl", model, prompts, batch_size=3)
    res = compare_logs(log, other)
    assert res.identical and res.records_compared == RECORDS, res.message


def test_compare_names_the_first_difference(setup, tmp_path):
    def forge(lines):
        rec = load(lines[7])  # record 6
        rec["logprob_bits"][3] ^= 1 << 4
        lines[7] = dump(rec)
        return rechain(lines)

    path = _tampered(setup, tmp_path, forge)
    res = compare_logs(setup[3], path)
    d = res.first_difference
    assert not res.identical and (d["record"], d["token"]) == (6, 3), res.message
    assert d["a"]["token"] == d["b"]["token"] and d["a"]["logprob"] != d["b"]["logprob"]
    assert "record 6" in res.message and "token 3" in res.message


def test_compare_names_different_settings_and_env(setup, tmp_path):
    _, model, prompts, log = setup
    res = compare_logs(log, make_log(tmp_path / "s.jsonl", model, prompts, seed=7))
    assert not res.identical and res.run_differences == ["seed"], res.message
    env = _tampered(
        setup, tmp_path, _edit_header(lambda h: h["env"].update(device="elsewhere"), genesis=False)
    )
    res = compare_logs(log, env)
    assert res.identical and res.env_differences == ["device"]


def test_compare_refuses_a_broken_log(setup, tmp_path):
    path = _tampered(setup, tmp_path, lambda ls: ls[:-1])
    res = compare_logs(setup[3], path)
    assert not res.identical and "cannot compare" in res.message and "ends early" in res.message


def test_fields_outside_the_format_fail_the_audit(setup, tmp_path):
    """A reward and a text added to a record are data no hash covers: the audit fails there."""
    forged = _edit_record(2, lambda r: r.update(reward=1.0, text="forged text"))
    res = audit_log(_tampered(setup, tmp_path, forged))
    assert not res.ok and res.problem.line == 4 and res.problem.record == 2
    assert "fields outside the log format: reward, text" in res.problem.message


def test_non_canonical_bytes_fail_the_audit(setup, tmp_path):
    """CRLF line ends or re-formatted JSON fail the audit on their line, though every hash
    still verifies (the chain covers values, the byte form check covers the bytes)."""
    res = audit_log(_tampered(setup, tmp_path, lambda ls: [x.replace(b"\n", b"\r\n") for x in ls]))
    assert not res.ok and res.problem.line == 1 and "CR LF" in res.problem.message

    def spaced(lines):
        lines[3] = lines[3].replace(b'","', b'", "')
        return lines

    res = audit_log(_tampered(setup, tmp_path, spaced))
    assert not res.ok and res.problem.line == 4 and "exact JSON" in res.problem.message
    assert "\n" not in res.summary()


def test_a_missing_final_newline_is_not_called_a_torn_write(setup, tmp_path):
    res = audit_log(_tampered(setup, tmp_path, lambda ls: ls[:-1] + [ls[-1][:-1]]))
    assert not res.ok and res.problem.line == RECORDS + 1
    assert "lacks its final newline" in res.problem.message and "killed" not in res.problem.message


def test_an_over_long_line_is_a_problem_read_in_bounded_memory(setup, tmp_path, monkeypatch):
    """A line past the size limit is a located problem; the audit (labels included) never
    holds more than the limit of it in memory."""
    import tracemalloc

    from bi_rl.rollout import schema

    monkeypatch.setattr(schema, "MAX_LINE_BYTES", 1 << 20)
    lines = read_lines(setup[3])
    big = write_lines(
        tmp_path / "big.jsonl", [*lines[:3], b'{"x": "' + b"a" * (16 << 20) + b'"}\n']
    )
    tracemalloc.start()
    try:
        res = audit_log(big)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert not res.ok and res.problem.line == 4 and "longer than the limit" in res.problem.message
    assert peak < 4 << 20, f"the audit allocated {peak} bytes"
