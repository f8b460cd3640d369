"""bi-rollout: the log is a function of the run settings alone; bad input ends in one line.

Properties: the log file is byte-identical for batch sizes 1, 3 and 8 and different
prefill chunks (only the sidecar differs); a run killed mid-way (SIGKILL, then a torn
last line) and resumed, with another batch size, gives the byte-identical log; resuming
with different settings is refused naming the field; a missing model, an empty prompt
set, a missing field, an unwritable or existing output each give a one-line error and a
nonzero exit, never a traceback.
"""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest
from tiny_models import CHAT_TEMPLATE, build_model, write_jsonl

from bi_rl.cli.rollout import main, setup_arg_parser
from bi_rl.rollout.log import read_header, read_log
from bi_rl.rollout.schema import Sidecar

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli")
    model = build_model(root / "model", chat_template=CHAT_TEMPLATE)
    rows = [{"id": f"q{i}", "prompt": f"{i * 37 % 1000}+{i * 91 % 1000}="} for i in range(24)]
    prompts = write_jsonl(root / "prompts.jsonl", rows)
    return root, model, prompts


def _args(setup, out, *extra):
    _, model, prompts = setup
    return [
        "--model",
        str(model),
        "--prompts",
        str(prompts),
        "--out",
        str(out),
        "--quiet",
        "--n",
        "2",
        "--max-tokens",
        "6",
        "--limit",
        "6",
        *extra,
    ]


def test_log_is_identical_whatever_the_batch_size(setup, tmp_path):
    outs = []
    for bs, chunk in ((1, 512), (3, 2), (8, 5)):
        out = tmp_path / f"bs{bs}.jsonl"
        assert main(_args(setup, out, "--batch-size", str(bs), "--prefill-chunk", str(chunk))) == 0
        outs.append(out)
        side = orjson.loads(Sidecar.path(out).read_bytes())["runs"][-1]
        assert side["engine"]["batch_size"] == bs and side["records"] == 12
    assert outs[0].read_bytes() == outs[1].read_bytes() == outs[2].read_bytes()
    header, records = read_log(outs[0])
    assert len(records) == 12
    assert header.run.n == 2 and header.run.prompt_count == 6
    assert header.env.invariant_mode == "strict" and header.env.backend == "cpu"
    assert all(header.env.to_json()[k] for k in ("mlx", "mlx_lm", "bi_rl", "device", "model_path"))
    assert Sidecar.read(outs[2]).batch_sizes() == [8], "the sidecar, typed, reads what it wrote"
    assert b"batch" not in outs[0].read_bytes()


def test_no_arguments_runs_the_embedded_default(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main([]) == 0
    header, records = read_log(tmp_path / "rollouts" / "run.jsonl")
    assert header.env.model_path == "embedded:tiny-adder" and len(records) == 64
    assert "bi-rollout: wrote 64 samples" in capsys.readouterr().err
    assert main([]) == 1, "a second run refuses to overwrite the first"
    assert "already exists; pass --resume" in capsys.readouterr().err


def test_settings_reach_the_header_and_change_the_samples(setup, tmp_path):
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    assert (
        main(
            _args(
                setup,
                a,
                "--temperature",
                "0.7",
                "--top-k",
                "5",
                "--top-p",
                "0.9",
                "--min-p",
                "0.01",
                "--seed",
                "11",
                "--stop",
                "==",
            )
        )
        == 0
    )
    run = read_header(a).to_json()["run"]
    assert run["sampler"] == {"temperature": 0.7, "top_k": 5, "top_p": 0.9, "min_p": 0.01}
    assert run["seed"] == 11 and run["stop_strings"] == ["=="]
    assert (
        main(
            _args(
                setup,
                b,
                "--temperature",
                "0.7",
                "--top-k",
                "5",
                "--top-p",
                "0.9",
                "--min-p",
                "0.01",
                "--seed",
                "12",
                "--stop",
                "==",
            )
        )
        == 0
    )
    ta = [r.tokens for r in read_log(a)[1]]
    tb = [r.tokens for r in read_log(b)[1]]
    assert ta != tb, "a different seed draws different tokens"


def _cli(*args, **kw):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "bi_rl.cli.rollout", *args]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kw)


def test_killed_run_resumes_to_the_identical_log(setup, tmp_path):
    full = tmp_path / "full.jsonl"
    args = ["--limit", "24", "--max-tokens", "24"]
    assert main([*_args(setup, full, "--batch-size", "8"), *args]) == 0
    part = tmp_path / "part.jsonl"
    proc = _cli(*_args(setup, part, "--batch-size", "2"), *args)
    deadline = time.time() + 60
    while time.time() < deadline and proc.poll() is None:
        if part.exists() and part.read_bytes().count(b"\n") >= 3:
            break
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    done = part.read_bytes().count(b"\n") - 1
    assert 2 <= done < 48, f"the kill must land mid-run ({done} of 48 records written)"
    full_lines = full.read_bytes().splitlines(keepends=True)
    assert part.read_bytes() == b"".join(full_lines[: done + 1]), "a prefix of the full log"
    with open(part, "ab") as f:  # and a torn write on top, as a kill mid-write leaves
        f.write(full_lines[done + 1][:40])
    assert main([*_args(setup, part, "--batch-size", "5", "--resume"), *args]) == 0
    assert part.read_bytes() == full.read_bytes()
    runs = orjson.loads(Sidecar.path(part).read_bytes())["runs"]
    assert [r["resumed_from"] for r in runs] == [done]  # the killed run never finished
    before = part.read_bytes()
    assert main([*_args(setup, part, "--resume"), *args]) == 0  # complete: nothing to do
    assert part.read_bytes() == before
    runs = orjson.loads(Sidecar.path(part).read_bytes())["runs"]
    assert [r["resumed_from"] for r in runs] == [done, 48], "the sidecar keeps each run"


def test_resume_with_other_settings_is_refused(setup, tmp_path, capsys):
    out = tmp_path / "a.jsonl"
    assert main(_args(setup, out)) == 0
    assert main(_args(setup, out, "--resume", "--seed", "5")) == 1
    err = capsys.readouterr().err
    assert "cannot resume: header differs in run.seed" in err and err.count("\n") == 1


def _error(setup, tmp_path, capsys, argv):
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 1
    assert err.startswith("bi-rollout: error: ") and err.count("\n") == 1, err
    assert "Traceback" not in err
    return err


def test_one_line_errors(setup, tmp_path, capsys):
    root, model, prompts = setup
    out = str(tmp_path / "o.jsonl")
    e = lambda *a: _error(setup, tmp_path, capsys, list(a))
    assert "no such directory" in e(
        "--model", str(root / "nope"), "--prompts", str(prompts), "--out", out
    )
    assert "is a file" in e("--model", str(prompts), "--prompts", str(prompts), "--out", out)
    assert "no config.json" in e("--model", str(root), "--prompts", str(prompts), "--out", out)
    assert "--prompts is required" in e("--model", str(model), "--out", out)
    write_jsonl(tmp_path / "empty.jsonl", [])
    err = e("--model", str(model), "--prompts", str(tmp_path / "empty.jsonl"), "--out", out)
    assert "prompt set is empty" in err
    err = e(*_args(setup, out, "--prompt-field", "question"))
    assert "no field 'question'" in err and "--prompt-field" in err
    blocker = tmp_path / "file"
    blocker.write_text("x")
    assert "cannot create the output directory" in e(*_args(setup, blocker / "o.jsonl"))
    assert "is a directory" in e(*_args(setup, tmp_path))
    assert main(_args(setup, out)) == 0
    assert "already exists; pass --resume" in e(*_args(setup, out))
    assert "seed must be an integer in [0, 2^64)" in e(
        *_args(setup, out, "--overwrite", "--seed", "-1")
    )
    assert "top_p must be" in e(*_args(setup, out, "--overwrite", "--top-p", "0"))
    assert "batch_size must be" in e(*_args(setup, out, "--overwrite", "--batch-size", "0"))
    assert main(_args(setup, out, "--overwrite")) == 0


def test_no_traceback_from_a_subprocess(setup, tmp_path):
    root, _, prompts = setup
    proc = _cli("--model", str(root / "nope"), "--prompts", str(prompts), "--out", "x.jsonl")
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 1
    assert (
        err.decode().strip()
        == f"bi-rollout: error: model {str(root / 'nope')!r}: no such directory"
    )


def test_help_names_every_option():
    text = setup_arg_parser().format_help()
    for opt in (
        "--model",
        "--prompts",
        "--prompt-field",
        "--n",
        "--temperature",
        "--top-p",
        "--top-k",
        "--min-p",
        "--seed",
        "--max-tokens",
        "--batch-size",
        "--out",
        "--resume",
        "--stop",
        "--mode",
    ):
        assert opt in text


def test_progress_bar_shows_tokens_per_second_on_a_terminal():
    import io

    from bi_rl.cli.rollout import Progress
    from bi_rl.rollout.engine import Step

    class Tty(io.StringIO):
        def isatty(self):
            return True

    stream = Tty()
    bar = Progress(stream)
    bar(Step(ready=[], generated=40, prefilled=10, active=4), 3, 12)
    bar(Step(ready=[], generated=8, prefilled=0, active=0), 12, 12)
    text = stream.getvalue()
    assert text.startswith("\r[") and "12/12 samples" in text and "48 tok" in text
    assert "tok/s" in text
    quiet = Tty()
    Progress(quiet, quiet=True)(Step([], 5, 0, 1), 1, 2)
    assert quiet.getvalue() == ""
