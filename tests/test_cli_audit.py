"""bi-audit: exit codes and one-line verdicts for one log, two logs and --model.

Properties: an untouched log exits 0; every tamper kind (a logprob bit, a token, a dropped,
duplicated or reordered record, a truncated last line, an edited header) exits 1 with one
line naming the file, line, record and token; malformed files exit 1 with one line, never a
traceback; two logs of one run with different batch sizes are IDENTICAL (exit 0), a forged
one is DIFFERENT at its record and token (exit 1); --model re-derives tokens (exit 0) and
catches a rechained forgery (exit 1); a model that differs from the header is refused
(exit 2) unless --force; --json carries the same verdicts.
"""

import subprocess
import sys
from pathlib import Path

import orjson
import pytest
from log_tools import (
    ADDITION_ROWS,
    committed_logs,
    cpu_without_gathers,
    dump,
    load,
    make_log,
    read_lines,
    rechain,
    reseal_header,
    write_lines,
)
from tiny_models import build_model, write_jsonl

from bi_rl.cli.audit import main

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli_audit")
    model = build_model(root / "model")
    prompts = write_jsonl(root / "prompts.jsonl", ADDITION_ROWS)
    log = make_log(root / "a.jsonl", model, prompts, limit=3)  # 6 records
    return root, model, prompts, log


def _run(capsys, argv):
    rc = main(argv)
    cap = capsys.readouterr()
    assert "Traceback" not in cap.out + cap.err
    return rc, cap.out.strip().splitlines(), cap.err.strip()


def _flip_record(i, field, j, bit=0):
    def edit(lines):
        rec = load(lines[i + 1])
        rec[field][j] ^= 1 << bit
        lines[i + 1] = dump(rec)
        return lines

    return edit


def _header_edit(lines):
    h = load(lines[0])
    h["run"]["seed"] = 1
    lines[0] = dump(reseal_header(h))
    return lines


TAMPERS = {
    "logprob bit": (
        _flip_record(2, "logprob_bits", 3, 17),
        ":4: record 2 (prompt 'q1' (index 1), sample 0): token 3: hash chain broken",
    ),
    "token": (
        _flip_record(1, "tokens", 0),
        ":3: record 1 (prompt 'q0' (index 0), sample 1): token 0: hash chain broken",
    ),
    "dropped record": (
        lambda ls: ls[:2] + ls[3:],
        ":3: record 1 (prompt 'q1' (index 1), sample 0): token 0: hash chain broken",
    ),
    "duplicated record": (
        lambda ls: ls[:3] + [ls[2]] + ls[3:],
        ":4: record 2 (prompt 'q0' (index 0), sample 1): token 0: hash chain broken",
    ),
    "reordered records": (
        lambda ls: [ls[0], ls[2], ls[1]] + ls[3:],
        ":2: record 0 (prompt 'q0' (index 0), sample 1): token 0: hash chain broken",
    ),
    "dropped last record": (lambda ls: ls[:-1], ":7: record 5: log ends early: 5 records"),
    "truncated last line": (lambda ls: ls[:-1] + [ls[-1][:-2]], ":7: record 5: truncated last"),
    "edited header": (_header_edit, ":1: genesis hash does not match"),
}


def test_untouched_log_passes(setup, capsys):
    rc, out, err = _run(capsys, [str(setup[3])])
    assert rc == 0 and len(out) == 1 and "OK: 6 records" in out[0] and not err


@pytest.mark.parametrize("name", list(TAMPERS))
def test_each_tamper_exits_1_with_one_located_line(setup, tmp_path, capsys, name):
    edit, where = TAMPERS[name]
    path = write_lines(tmp_path / "t.jsonl", edit(read_lines(setup[3])))
    rc, out, _ = _run(capsys, [str(path)])
    assert rc == 1 and len(out) == 1, out
    assert out[0].startswith(f"bi-audit: {path}{where}"), out[0]
    rc, js = main([str(path), "--json"]), orjson.loads(capsys.readouterr().out)
    assert rc == 1 and js["ok"] is False and js["audit"]["problem"]["line"] is not None


@pytest.mark.parametrize("content", [b"", b"not json\n", b"\xff\xfe\x00", b"{}\n", b"[]\n"])
def test_malformed_files_exit_1_with_one_line(tmp_path, capsys, content):
    path = tmp_path / "bad.jsonl"
    path.write_bytes(content)
    rc, out, _ = _run(capsys, [str(path)])
    assert rc == 1 and len(out) == 1 and out[0].startswith(f"bi-audit: {path}")


def test_missing_file_and_bad_arguments(tmp_path, capsys):
    rc, out, _ = _run(capsys, [str(tmp_path / "nope.jsonl")])
    assert rc == 1 and "no such log file" in out[0]
    rc, out, _ = _run(capsys, [str(tmp_path)])
    assert rc == 1 and "is a directory, not a log file" in out[0]
    with pytest.raises(SystemExit) as e:
        main(["a", "b", "c"])
    assert e.value.code == 2 and "one log to verify or two" in capsys.readouterr().err


def test_two_logs(setup, tmp_path, capsys):
    _, model, prompts, log = setup
    same = make_log(tmp_path / "b.jsonl", model, prompts, limit=3, batch_size=1)
    rc, out, _ = _run(capsys, [str(log), str(same)])
    assert rc == 0 and out[-1].startswith("bi-audit: IDENTICAL: 6 records")
    lines = read_lines(log)
    rec = load(lines[4])  # record 3
    rec["tokens"][2] ^= 1
    lines[4] = dump(rec)
    forged = write_lines(tmp_path / "f.jsonl", rechain(lines))
    rc, out, _ = _run(capsys, [str(log), str(forged)])
    assert (
        rc == 1 and "DIFFERENT: logs differ first at record 3" in out[-1] and "token 2" in out[-1]
    )
    rc, out, _ = _run(
        capsys,
        [str(log), str(make_log(tmp_path / "s.jsonl", model, prompts, limit=3, temperature=0.5))],
    )
    assert rc == 1 and "different run settings" in out[-1] and "sampler.temperature" in out[-1]
    # one file named twice (here by another spelling) is no comparison: refused, not IDENTICAL
    rc, out, err = _run(capsys, [str(log), str(log.parent / "." / log.name)])
    assert (
        rc == 2
        and out == []
        and err == ("bi-audit: error: both LOGs name the same file; give two logs to compare")
    )


def test_model_rederivation(setup, tmp_path, capsys):
    _, model, _, log = setup
    rc, out, _ = _run(capsys, [str(log), "--model"])  # the header's model
    assert rc == 0 and "re-derived with" in out[-1] and "tokens" in out[-1]
    lines = read_lines(log)
    rec = load(lines[2])  # record 1
    rec["tokens"][1] = (rec["tokens"][1] + 7) % 40 + 4
    lines[2] = dump(rec)
    forged = write_lines(tmp_path / "forged.jsonl", rechain(lines))
    rc, out, _ = _run(capsys, [str(forged), "--model", str(model)])
    assert rc == 1 and out[0].endswith("hash chain verified" + out[0].split("verified")[-1])
    assert any(
        ":3: record 1 (prompt 'q0' (index 0), sample 1): token 1: logged token" in x for x in out
    ), out
    rc, js = (
        main([str(forged), "--model", str(model), "--json"]),
        orjson.loads(capsys.readouterr().out),
    )
    assert rc == 1 and js["rederive"][str(forged)]["first_token_mismatch"]["record"] == 1


def test_fields_outside_the_format_fail_with_and_without_model(setup, tmp_path, capsys):
    """Unverified data never reads OK: a record with an added reward and text fails the audit
    (exit 1, one line naming the line and the fields), also with --model."""
    lines = read_lines(setup[3])
    rec = load(lines[2])
    rec.update(reward=1.0, text="forged text")
    path = write_lines(tmp_path / "f.jsonl", [*lines[:2], dump(rec), *lines[3:]])
    for extra in ([], ["--model", str(setup[1])]):
        rc, out, err = _run(capsys, [str(path), *extra])
        assert rc == 1 and len(out) == 1 and not err, (out, err)
        assert ":3: record 1" in out[0] and "fields outside the log format: reward, text" in out[0]
        assert "OK" not in out[0]


@pytest.mark.filterwarnings("ignore::bi_rl.BatchVariantWarning")
def test_model_rederivation_takes_the_mode_from_the_header(tmp_path, capsys):
    from bi_rl import backends

    model = build_model(tmp_path / "moe", "mixtral")
    prompts = write_jsonl(tmp_path / "prompts.jsonl", ADDITION_ROWS)
    with backends.use(cpu_without_gathers()):
        log = make_log(tmp_path / "fb.jsonl", model, prompts, limit=3, mode="fallback")
        rc, out, _ = _run(capsys, [str(log), "--model"])
        assert rc == 0 and "(mode fallback)" in out[-1], out
        rc, _, err = _run(capsys, [str(log), "--model", "--mode", "strict"])
        assert rc == 2 and "gather_mm" in err and "in layer model.layers.0." in err, err


def test_model_mismatch_is_refused_unless_forced(setup, tmp_path, capsys):
    other = build_model(tmp_path / "other", key=4)
    rc, _, err = _run(capsys, [str(setup[3]), "--model", str(other)])
    assert rc == 2 and len(err.splitlines()) == 1 and "model" in err and "--force" in err
    rc, out, _ = _run(capsys, [str(setup[3]), "--model", str(other), "--force"])
    assert rc == 1 and "re-derivation FAILED" in out[-1]


def test_runs_as_a_module():
    out = subprocess.run(
        [sys.executable, "-m", "bi_rl.cli.audit", "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0 and "--model" in out.stdout and "Exit status" in out.stdout


GOLDEN = committed_logs(ROOT)


@pytest.mark.parametrize("log", GOLDEN, ids=[p.name for p in GOLDEN])
def test_golden_logs_verify_and_rederive(log, capsys):
    """Each committed log's tokens are re-derived from their keys and the embedded model."""
    import bi_rl
    from bi_rl.rollout.log import read_header

    if read_header(log).env.backend != bi_rl.active_backend().name:
        pytest.skip(f"{log.name} was made on another backend")
    rc, out, _ = _run(capsys, [str(log), "--model"])
    assert rc == 0 and "OK:" in out[0] and "re-derived with embedded:" in out[-1], out


def test_rederive_draws_a_progress_bar_on_a_terminal(setup, monkeypatch):
    import io
    import sys

    _, model, _, log = setup

    class Tty(io.StringIO):
        def isatty(self):
            return True

    tty = Tty()
    monkeypatch.setattr(sys, "stderr", tty)
    assert main([str(log), "--model", str(model)]) == 0
    assert "6/6 samples re-derived" in tty.getvalue() and "tok/s" in tty.getvalue()
