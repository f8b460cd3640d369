"""bi-rescore: rollout then rescore reports 0 differing tokens and KL exactly 0; bad input is named.

Properties: a bi-rollout log rescored with the default composition (a batch size one below
the rollout's, read from the sidecar, and a shuffled order, with padded rows as a guard) and
with chosen ones (batch 1, reversed, chunked) has every logprob and logit fingerprint
bitwise equal, k1 = k2 = k3 = 0 exactly, exit 0; a forged logprob gives exit 1 and names the
first divergent sample and position with both values; a different model, tokenizer or
backend is refused (exit 2) naming what differs, unless --force; malformed logs and a
missing model give one line on stderr, exit 2, never a traceback; committed golden logs
under rollouts/ rescore to zero differences.
"""

import shutil
import subprocess
import sys
from pathlib import Path

import mlx.core as mx
import orjson
import pytest
from conftest import cpu_default, ensure_qwen2_05b
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

from bi_rl import backends
from bi_rl.cli.rescore import main
from bi_rl.rollout.log import read_header
from bi_rl.rollout.schema import Sidecar

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("rescore")
    model = build_model(root / "model")
    prompts = write_jsonl(root / "prompts.jsonl", ADDITION_ROWS)
    log = make_log(root / "run.jsonl", model, prompts, n=3, max_tokens=8, limit=6)
    return root, model, prompts, log


def _json(capsys, argv):
    rc = main([*argv, "--json"])
    out = capsys.readouterr().out
    return rc, orjson.loads(out)


def _one_line_error(capsys, argv, *needles):
    rc = main(argv)
    cap = capsys.readouterr()
    err = cap.err.strip()
    assert rc == 2, (rc, cap.out, cap.err)
    assert len(err.splitlines()) == 1 and err.startswith("bi-rescore: error:"), err
    assert "Traceback" not in err
    for n in needles:
        assert n in err, err
    return err


def test_round_trip_default_composition(setup, capsys):
    _, _, _, log = setup
    rc, js = _json(capsys, [str(log)])
    r, c = js["report"], js["composition"]
    assert rc == 0 and js["ok"] and r["identical"]
    assert r["tokens"] > 50 and r["equal"] == r["tokens"] and r["differing"] == 0
    assert r["fingerprints_equal"] == r["fingerprints_compared"] == r["tokens"]
    for k in ("k1_mean", "k1_max", "k2_mean", "k2_max", "k3_mean", "k3_max", "max_abs_diff"):
        assert r[k] == 0.0, k
    assert r["aliases"]["rollout_corr/k3_kl"] == 0.0
    # Guards: the composition differed from the rollout's, and rows really were padded.
    assert c["rollout_batch_sizes"] == [8] and c["batch_size"] == 7
    assert c["order"] == "shuffled (seed 0)" and c["padded_rows"] > 0 and c["batches"] == 3
    assert all(v["equal"] for v in js["header_checks"].values()) and js["forced"] == []
    assert js["env_notes"] == []
    assert js["environment"]["backend"] == backends.active().name


def test_table_output(setup, capsys):
    assert main([str(setup[3])]) == 0
    out = capsys.readouterr().out
    assert "bitwise equal" in out and "KL exactly 0" in out and "batch size 7" in out
    assert out.strip().splitlines()[-1].startswith("OK: 0 of ")


@pytest.mark.parametrize(
    "extra",
    [
        ["--batch-size", "1", "--order", "reversed"],
        ["--batch-size", "4", "--order", "longest-first", "--chunk", "3"],
        ["--batch-size", "18", "--order", "canonical", "--chunk", "1"],
        pytest.param(
            ["--mode", "off"],  # stock MLX: invariant on the CPU backend too (a finding)
            marks=pytest.mark.skipif(
                mx.default_device().type != mx.DeviceType.cpu,
                reason="stock MLX is batch-invariant on the CPU backend alone",
            ),
        ),
    ],
)
def test_chosen_compositions(setup, capsys, extra):
    rc, js = _json(capsys, [str(setup[3]), *extra])
    assert rc == 0 and js["report"]["differing"] == 0 and js["report"]["identical"]


@pytest.mark.filterwarnings("ignore::bi_rl.BatchVariantWarning")
def test_mode_comes_from_the_logs_header(tmp_path, capsys):
    """A log made with --mode fallback is rescored in fallback unless --mode says otherwise:
    on a backend without MoE gathers, strict refuses the model naming op and layer."""
    model = build_model(tmp_path / "moe", "qwen3_moe")
    prompts = write_jsonl(tmp_path / "prompts.jsonl", ADDITION_ROWS)
    # the CPU backend (without gathers) on the CPU device, also on a machine with a GPU
    with cpu_default(), backends.use(cpu_without_gathers()):
        log = make_log(tmp_path / "fb.jsonl", model, prompts, limit=3, mode="fallback")
        assert read_header(log).env.invariant_mode == "fallback"
        rc, js = _json(capsys, [str(log)])
        assert rc == 0 and js["report"]["differing"] == 0
        assert js["composition"]["mode"] == "fallback" == js["environment"]["invariant_mode"]
        assert js["composition"]["mode_from"] == "the log's header"
        err = _one_line_error(
            capsys, [str(log), "--mode", "strict"], "gather_mm", "--mode fallback"
        )
        assert "in layer model.layers.0.mlp.switch_mlp." in err, err


def test_unknown_rollout_batch_size_and_report_file(setup, tmp_path, capsys):
    log = tmp_path / "copy.jsonl"
    shutil.copy(setup[3], log)
    assert not Sidecar.path(log).exists()
    report = tmp_path / "report.json"
    assert main([str(log), "--report", str(report)]) == 0
    assert "batch size unknown" in capsys.readouterr().out
    js = orjson.loads(report.read_bytes())
    assert js["composition"]["rollout_batch_sizes"] == []
    assert js["composition"]["batch_size"] == 7


def test_default_batch_size_avoids_every_rollout_batch_size():
    from bi_rl.score.rescore import default_batch_size

    assert default_batch_size([]) == 7 and default_batch_size([8]) == 7
    assert default_batch_size([1]) == 2 and default_batch_size([8, 7]) == 6
    assert default_batch_size([2, 1]) == 3


def test_forged_logprob_is_found(setup, tmp_path, capsys):
    lines = read_lines(setup[3])
    rec = load(lines[5])  # record 4
    rec["logprob_bits"][2] += 3
    lines[5] = dump(rec)
    log = write_lines(tmp_path / "forged.jsonl", rechain(lines))
    rc, js = _json(capsys, [str(log), "--model", str(setup[1])])
    d = js["report"]["first_divergence"]
    assert rc == 1 and not js["ok"] and js["report"]["differing"] == 1
    assert (d["sample"], d["position"]) == (4, 2) and d["rescored_bits"] == d["rollout_bits"] - 3
    assert js["report"]["k3_max"] > 0
    assert main([str(log), "--model", str(setup[1])]) == 1
    out = capsys.readouterr().out
    assert "first divergence" in out and "position 2" in out and "MISMATCH: 1 of" in out


def test_different_model_is_refused_unless_forced(setup, tmp_path, capsys):
    other = build_model(tmp_path / "other", key=9)
    _one_line_error(capsys, [str(setup[3]), "--model", str(other)], "model", "--force")
    rc, js = _json(capsys, [str(setup[3]), "--model", str(other), "--force"])
    assert rc == 1 and js["forced"] == ["model"] and js["report"]["first_divergence"] is not None


def test_different_tokenizer_is_refused(setup, tmp_path, capsys):
    copy = tmp_path / "tok"
    shutil.copytree(setup[1], copy)
    cfg = copy / "tokenizer_config.json"
    cfg.write_bytes(cfg.read_bytes().replace(b"{", b'{"model_max_length": 77,', 1))
    err = _one_line_error(capsys, [str(setup[3]), "--model", str(copy)], "tokenizer")
    assert "model," not in err, "only the tokenizer differs"


def test_different_backend_is_refused(setup, tmp_path, capsys):
    lines = read_lines(setup[3])
    h = load(lines[0])
    other = "metal" if backends.active().name == "cuda" else "cuda"  # not this machine's
    h["env"]["backend"] = other  # env is outside the chain: the records stay valid
    lines[0] = dump(reseal_header(h))
    log = write_lines(tmp_path / f"{other}.jsonl", lines)
    _one_line_error(capsys, [str(log), "--model", str(setup[1])], f"backend {other} in the log")


def test_other_versions_are_noted_not_refused(setup, tmp_path, capsys):
    lines = read_lines(setup[3])
    h = load(lines[0])
    h["env"]["mlx"] = "0.0.1"
    lines[0] = dump(reseal_header(h))
    log = write_lines(tmp_path / "old.jsonl", lines)
    assert main([str(log), "--model", str(setup[1])]) == 0
    assert "note: mlx 0.0.1 in the log" in capsys.readouterr().out


def test_missing_model_directory_is_named(setup, tmp_path, capsys):
    gone = tmp_path / "gone"
    shutil.copytree(setup[1], gone)
    log = make_log(tmp_path / "g.jsonl", gone, setup[2], limit=1, n=1, max_tokens=2)
    shutil.rmtree(gone)
    _one_line_error(capsys, [str(log)], "not a directory on this machine", "--model")
    _one_line_error(capsys, [str(setup[3]), "--model", str(gone)], "no such directory")


@pytest.mark.parametrize(
    "make,needle",
    [
        (lambda p, good: None, "no such log file"),
        (lambda p, good: p.write_bytes(b""), "empty log"),
        (lambda p, good: p.write_bytes(b"\x89PNG\r\n\x1a\n"), "not valid JSON"),
        (lambda p, good: p.write_bytes(good[:-5]), "truncated last line"),
        (
            lambda p, good: p.write_bytes(
                good.replace(b'"finish":"length"', b'"finish":"stop"', 1)
            ),
            "record hash does not close",
        ),
        (
            lambda p, good: p.write_bytes(good.replace(b'"version":1', b'"version":2', 1)),
            "unsupported log version",
        ),
    ],
)
def test_malformed_logs_give_one_line(setup, tmp_path, capsys, make, needle):
    path = tmp_path / "bad.jsonl"
    make(path, setup[3].read_bytes())
    _one_line_error(capsys, [str(path), "--model", str(setup[1])], needle)


def test_a_log_killed_before_its_first_record_is_refused_and_a_partial_one_noted(
    setup, tmp_path, capsys
):
    lines = setup[3].read_bytes().splitlines(keepends=True)
    empty, part = tmp_path / "empty.jsonl", tmp_path / "part.jsonl"
    empty.write_bytes(lines[0])
    err = _one_line_error(capsys, [str(empty), "--model", str(setup[1])], "no records to rescore")
    assert "--resume" not in err, "resuming would only repeat whatever stopped that run"
    part.write_bytes(b"".join(lines[:3]))
    rc, js = _json(capsys, [str(part), "--model", str(setup[1])])
    assert rc == 0 and js["report"]["differing"] == 0
    assert any("incomplete: 2 of 18 records" in n for n in js["env_notes"]), js["env_notes"]


def test_another_attention_split_is_noted_with_the_setting_that_matches_the_log(
    setup, tmp_path, capsys, monkeypatch
):
    """The CUDA attention kernels give other bits at each split size: where the log's size
    (env.attention_split) is not this process's, or a log of the same backend records none
    (made before it was recorded, at 256), the report notes it and names the setting that
    rescores the log bit for bit; the same size, no note (this CPU plays a backend with
    splits: its env is given one)."""
    from dataclasses import replace

    from bi_rl.score import rescore

    real = rescore.environment
    monkeypatch.setattr(rescore, "environment", lambda *a: replace(real(*a), attention_split=512))
    lines = read_lines(setup[3])
    for logged, needle in (
        (256, "attention split 256 keys in the log, 512 here: other bits; set "
         "BI_RL_ATTN_SPLIT=256"),
        (None, "does not record its attention split size (logs made before it was recorded "
         "used 256 keys a split), 512 here"),
        (512, None),
    ):  # fmt: skip
        h = load(lines[0])
        h["env"].pop("attention_split", None)  # a log made on CUDA records one
        if logged is not None:
            h["env"]["attention_split"] = logged
        path = write_lines(tmp_path / f"{logged}.jsonl", [dump(reseal_header(h)), *lines[1:]])
        rc, js = _json(capsys, [str(path), "--model", str(setup[1])])
        assert rc == 0 and js["report"]["differing"] == 0, "a note, not a refusal"
        notes = [n for n in js["env_notes"] if "split" in n]
        if needle is None:
            assert notes == [], notes
        else:
            assert len(notes) == 1 and needle in notes[0], notes


def test_an_over_long_line_is_refused_in_one_line(setup, tmp_path, capsys, monkeypatch):
    """Memory per line is bounded in rescoring too: a line past the limit is a one-line error."""
    from bi_rl.rollout import schema

    lines = setup[3].read_bytes().splitlines(keepends=True)
    monkeypatch.setattr(schema, "MAX_LINE_BYTES", max(len(x) for x in lines) - 1)
    err = _one_line_error(
        capsys, [str(setup[3]), "--model", str(setup[1])], "longer than the limit"
    )
    assert "bytes a log line may hold" in err


def test_bad_options_are_named(setup, capsys):
    _one_line_error(capsys, [str(setup[3]), "--batch-size", "0"], "batch size must be >= 1")
    _one_line_error(capsys, [str(setup[3]), "--chunk", "0"], "chunk must be >= 1")
    _one_line_error(capsys, [str(setup[3]), "--shuffle-seed", "-1"], "shuffle seed must be >= 0")


def test_the_report_never_lands_on_a_log(setup, tmp_path, capsys):
    """--report over the log it rescores, that log's sidecar or another rollout log is refused
    before rescoring, every byte kept; a report in a new folder is written there."""
    log = tmp_path / "run.jsonl"
    shutil.copy(setup[3], log)
    shutil.copy(Sidecar.path(setup[3]), Sidecar.path(log))
    other = tmp_path / "other.jsonl"
    shutil.copy(setup[3], other)
    files = {p: p.read_bytes() for p in (log, Sidecar.path(log), other)}
    for report, needle in (
        (log, "is also the log being rescored"),
        (tmp_path / "." / log.name, "is also the log being rescored"),
        (Sidecar.path(log), "is the sidecar of rollout log"),
        (other, "is a bi-rl rollout log"),
        (tmp_path, "is a directory"),
    ):
        err = _one_line_error(capsys, [str(log), "--report", str(report)], "--report", needle)
        assert "samples" not in err
    assert {p: p.read_bytes() for p in files} == files
    report = tmp_path / "new" / "folder" / "report.json"
    assert main([str(log), "--report", str(report)]) == 0
    assert orjson.loads(report.read_bytes())["ok"] is True


GOLDEN = committed_logs(ROOT)


@pytest.mark.parametrize("log", GOLDEN, ids=[p.name for p in GOLDEN])
def test_golden_logs_rescore_bitwise(log, capsys):
    import bi_rl

    header = read_header(log)
    if header.env.backend != bi_rl.active_backend().name:
        pytest.skip(f"{log.name} was made on {header.env.backend}")
    if header.env.backend == "cuda":
        ensure_qwen2_05b(header.env.model_path)
    rc, js = _json(capsys, [str(log)])
    assert rc == 0 and js["report"]["differing"] == 0 and js["report"]["tokens"] > 0


def test_runs_as_a_module():
    out = subprocess.run(
        [sys.executable, "-m", "bi_rl.cli.rescore", "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0 and "Exit status" in out.stdout and "--batch-size" in out.stdout


def test_progress_bar_on_a_terminal(setup, monkeypatch, capsys):
    """On a terminal bi-rescore draws a bar with tokens/s that reaches every sample; piped
    output (the default here) stays free of it."""
    import io

    _, _, _, log = setup

    class Tty(io.StringIO):
        def isatty(self):
            return True

    tty = Tty()
    monkeypatch.setattr(sys, "stderr", tty)
    assert main([str(log)]) == 0
    total = len(read_lines(log)) - 1
    assert f"{total}/{total} samples rescored" in tty.getvalue() and "tok/s" in tty.getvalue()
    monkeypatch.undo()
    assert main([str(log)]) == 0
    assert "samples rescored" not in capsys.readouterr().err
