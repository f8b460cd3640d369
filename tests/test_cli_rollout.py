"""bi-rollout: the log is a function of the run settings alone; bad input ends in one line.

Properties: the log file is byte-identical for batch sizes 1, 3 and 8 and different
prefill chunks (only the sidecar differs); a run killed mid-way (SIGKILL, then a torn
last line) and resumed, with another batch size, gives the byte-identical log; resuming
with different settings is refused naming the field; a missing model, an empty prompt
set, a missing field, an unwritable or existing output each give a one-line error and a
nonzero exit, never a traceback. Nothing is lost: a refused --overwrite (bad model, bad
prompts, a prompt past the context, an op strict mode refuses) leaves the old log byte for
byte, a refused or interrupted run leaves no file that blocks a rerun, and --overwrite puts
the new log in place only with its first records. Prompts are checked against the model's
context on both sides of each threshold; the embedded defaults fit it; summaries count what
the run wrote; dropped characters are named once.
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
    assert "a stop string must not be empty" in e(*_args(setup, out, "--overwrite", "--stop", ""))
    assert main(_args(setup, out, "--overwrite")) == 0


def test_the_log_never_lands_on_its_prompts(setup, tmp_path, capsys):
    """--out naming the prompt file (as given, by another spelling, through a hard link) is
    refused even with --overwrite, the prompts kept byte for byte."""
    _, _, prompts = setup
    kept = prompts.read_bytes()
    hard = tmp_path / "hard.jsonl"
    os.link(prompts, hard)
    for out in (prompts, prompts.parent / "." / prompts.name, hard):
        err = _error(setup, tmp_path, capsys, _args(setup, out, "--overwrite"))
        assert "is also the prompt file; choose another file" in err, err
    assert prompts.read_bytes() == kept


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


# -- nothing lost: every input is checked before the output is touched -----------------------


def _files(folder: Path) -> dict:
    """Every file under `folder` (hidden ones too) with its bytes."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


class RefusingModel:
    """A loaded mlx-lm model that, in a forward pass whose input satisfies `refuse`, calls an op
    strict mode refuses (einsum): a model the mode cannot run, caught at its first forward
    (refuse always) or only at some shapes (refuse batches wider than 2)."""

    def __init__(self, model, refuse):
        self.model, self.refuse = model, refuse

    @property
    def layers(self):
        return self.model.layers

    def __call__(self, x, cache=None):
        if self.refuse(x):
            import mlx.core as mx

            mx.einsum("ij->ji", mx.zeros((2, 2)))
        return self.model(x, cache=cache)


def _refusing(monkeypatch, refuse):
    from bi_rl.rollout import run

    real = run.load_model
    monkeypatch.setattr(
        run, "load_model", lambda p: (RefusingModel(real(p)[0], refuse), real(p)[1])
    )


def test_a_refused_overwrite_leaves_the_old_log_untouched(setup, tmp_path, capsys, monkeypatch):
    """Data loss: an --overwrite run refused for any reason (a missing model, a malformed
    prompt file, a prompt longer than the model's context, an op strict mode refuses at the
    first forward or only at the run's batch width) leaves the old log and its sidecar
    byte for byte as they were."""
    root, model, prompts = setup
    logs, inputs = tmp_path / "logs", tmp_path / "in"
    inputs.mkdir()
    out = logs / "run.jsonl"
    assert main(_args(setup, out)) == 0
    before = _files(logs)
    assert set(before) == {"run.jsonl", "run.jsonl.run.json"}
    bad = inputs / "bad.jsonl"
    bad.write_text('{"prompt": "1+1="}\n{oops\n')
    short = build_model(inputs / "short", context=7)
    long_rows = write_jsonl(inputs / "long.jsonl", [{"id": "long", "prompt": "1234+5678="}])
    cases = [
        (["--model", "/nonexistent"], "no such directory"),
        (["--prompts", str(bad)], "not valid JSON"),
        (["--model", str(short), "--prompts", str(long_rows)], "longer than the model's context"),
    ]
    for extra, needle in cases:
        err = _error(setup, tmp_path, capsys, [*_args(setup, out, "--overwrite"), *extra])
        assert needle in err
        assert _files(logs) == before, f"{needle}: the old log changed"
    for refuse in (lambda x: True, lambda x: x.shape[0] > 2):
        with monkeypatch.context() as m:
            _refusing(m, refuse)
            err = _error(setup, tmp_path, capsys, _args(setup, out, "--overwrite"))
        assert "einsum" in err and "not batch-invariant" in err
        assert _files(logs) == before, "a strict-mode refusal changed the old log"


def test_overwrite_puts_the_new_log_in_place_with_its_first_records(setup, tmp_path, monkeypatch):
    """The old log stays in place, untouched, until the new run has records to show: until
    then the new log is written aside in the same directory (by the writing thread, which
    renames it over the old one once it holds records)."""
    from bi_rl.rollout.engine import EngineConfig
    from bi_rl.rollout.log import LogWriter
    from bi_rl.rollout.run import RolloutConfig, rollout
    from bi_rl.rollout.sampler import SamplerConfig

    _, model, prompts = setup
    out = tmp_path / "run.jsonl"
    assert main(_args(setup, out)) == 0
    old = out.read_bytes()
    steps, renames = [], []
    real = LogWriter._put_in_place

    def put_in_place(self):
        aside = self._aside.read_bytes()
        renames.append((out.read_bytes() == old, aside.count(b"\n") - 1))
        real(self)
        renames.append((out.read_bytes() == aside, self._aside))

    monkeypatch.setattr(LogWriter, "_put_in_place", put_in_place)

    def progress(step, done, total):  # the writing thread may rename meanwhile: only a
        before = len(renames)  # view with no rename begun before or after it counts
        unchanged = out.read_bytes() == old
        if before == len(renames) == 0:
            steps.append(unchanged)

    cfg = RolloutConfig(
        model=str(model),
        prompts=str(prompts),
        out=str(out),
        limit=6,
        sampler=SamplerConfig(seed=3),
        engine=EngineConfig(n=2, max_tokens=6),
        overwrite=True,
    )
    rollout(cfg, progress)
    assert steps and all(steps), "guard: steps ran, and the old log stood meanwhile"
    (untouched, records), (replaced, aside) = renames
    assert untouched and records >= 1, "the old log stands until the new one has records"
    assert replaced and aside is None, "then the new log takes its place, in one rename"
    assert read_header(out).run.sampler.seed == 3 and len(read_log(out)[1]) == 12
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.jsonl", "run.jsonl.run.json"]


def test_a_refused_run_leaves_nothing_that_blocks_a_rerun(setup, tmp_path, capsys, monkeypatch):
    """A run refused or interrupted before its first record leaves no header-only log (nor
    any other file), so the plain command runs again as it is."""
    logs = tmp_path / "logs"
    out = logs / "run.jsonl"
    with monkeypatch.context() as m:
        _refusing(m, lambda x: True)
        err = _error(setup, tmp_path, capsys, _args(setup, out))
    assert "einsum" in err and "--resume" not in err
    assert not logs.exists(), "an op refused at every shape is caught before any file is made"
    with monkeypatch.context() as m:
        _refusing(m, lambda x: x.shape[0] > 2)
        err = _error(setup, tmp_path, capsys, _args(setup, out))
    assert "einsum" in err and "--resume" not in err
    assert not logs.exists() or _files(logs) == {}, _files(logs)

    def interrupt(x):
        raise KeyboardInterrupt

    with monkeypatch.context() as m:
        _refusing(m, lambda x: x.shape[0] > 2 and interrupt(x))
        assert main(_args(setup, out)) == 130
    err = capsys.readouterr().err
    assert "before the first sample" in err and "--resume" not in err, err
    assert not logs.exists() or _files(logs) == {}, _files(logs)
    assert main(_args(setup, out)) == 0, "the plain command runs again"
    assert len(read_log(out)[1]) == 12


def test_prompts_longer_than_the_context(setup, tmp_path, capsys):
    """A prompt longer than the model's context (max_position_embeddings, here 8) is refused
    by default, naming it; a prompt that fits but leaves no room for --max-tokens warns; both
    sides of each threshold; --allow-long-context runs either without a word."""
    model = build_model(tmp_path / "ctx8", context=8)
    rows = write_jsonl(
        tmp_path / "p.jsonl",
        [
            {"id": "a", "prompt": "1+2="},
            {"id": "b", "prompt": "12+345="},
            {"id": "c", "prompt": "12+3456="},
        ],
    )  # 4, 7 and 8 tokens (one per character)
    longer = write_jsonl(tmp_path / "q.jsonl", [{"id": "z", "prompt": "123+4567="}])  # 9

    def run(prompts, *extra, limit=3):
        argv = ["--model", str(model), "--prompts", str(prompts), "--limit", str(limit)]
        argv += ["--out", str(tmp_path / "o.jsonl"), "--overwrite", "--quiet", *extra]
        rc = main(argv)
        return rc, capsys.readouterr().err

    rc, err = run(longer, "--max-tokens", "1")
    assert rc == 1 and err.count("\n") == 1
    assert "prompt 'z' is 9 tokens, longer than the model's context of 8 positions" in err
    assert "--allow-long-context" in err
    rc, err = run(rows, "--max-tokens", "1")  # 8 tokens fill the context: no error
    assert rc == 0 and "prompt 'c' (8 tokens) plus --max-tokens 1" in err and "warning" in err
    rc, err = run(rows, "--max-tokens", "4", limit=1)  # 4 + 4 = 8 fits
    assert rc == 0 and err == ""
    rc, err = run(rows, "--max-tokens", "5", limit=1)  # 4 + 5 = 9 does not
    assert rc == 0 and err.count("\n") == 1
    assert err.startswith("bi-rollout: warning: prompt 'a' (4 tokens) plus --max-tokens 5")
    for prompts in (longer, rows):
        rc, err = run(prompts, "--max-tokens", "6", "--allow-long-context")
        assert rc == 0 and err == ""


def test_a_run_that_could_write_an_over_long_line_is_refused(setup, tmp_path, monkeypatch, capsys):
    """A log line holds at most MAX_LINE_BYTES, which readers enforce: a run whose prompt and
    --max-tokens could write a longer record is refused up front (both sides of the limit)."""
    from bi_rl.rollout import schema
    from bi_rl.rollout.schema import max_record_bytes

    _, model, prompts = setup
    out = tmp_path / "o.jsonl"
    argv = ["--model", str(model), "--prompts", str(prompts), "--limit", "1", "--quiet"]
    from mlx_lm.utils import load_tokenizer

    from bi_rl.rollout.prompts import load_prompts

    first = load_prompts(prompts, load_tokenizer(model), limit=1)[0]
    pid = first.id
    monkeypatch.setattr(schema, "MAX_LINE_BYTES", max_record_bytes(len(first.tokens), 6, pid))
    err = _error(setup, tmp_path, capsys, [*argv, "--out", str(out), "--max-tokens", "7"])
    assert "could make a log line of" in err and "lower --max-tokens" in err
    assert not out.exists()
    assert main([*argv, "--out", str(out), "--max-tokens", "6"]) == 0
    line = out.read_bytes().splitlines(keepends=True)[1]
    assert len(line) <= schema.MAX_LINE_BYTES and read_log(out)[1][0].prompt_id == pid


def test_the_embedded_defaults_fit_its_context(tmp_path, monkeypatch, capsys):
    """bi-rollout with no arguments stays inside the embedded model's context: the longest
    embedded prompt plus the default --max-tokens fit its 64 positions, and no warning."""
    from mlx_lm.utils import load_tokenizer

    from bi_rl.assets import DEFAULT_MODEL, DEFAULT_PROMPTS
    from bi_rl.model import context_length
    from bi_rl.rollout.prompts import load_prompts

    monkeypatch.chdir(tmp_path)
    assert main(["--limit", "2"]) == 0
    assert "warning" not in capsys.readouterr().err
    longest = max(
        len(p.tokens) for p in load_prompts(DEFAULT_PROMPTS, load_tokenizer(DEFAULT_MODEL))
    )
    ctx = context_length(DEFAULT_MODEL)
    assert ctx == 64
    assert longest + read_header(tmp_path / "rollouts" / "run.jsonl").run.max_tokens <= ctx


def _loud(setup, out, *extra):
    return [a for a in _args(setup, out, *extra) if a != "--quiet"]


def test_messages_say_what_happened(setup, tmp_path, capsys, monkeypatch):
    """The summary counts what this run wrote (new samples and tokens on a resume), says when
    a resumed log was already complete, and says "1 sample"; --out on a device, --resume of
    a missing or empty file and a failing write each name the real problem."""
    one = tmp_path / "one.jsonl"
    assert main(_loud(setup, one, "--n", "1", "--limit", "1")) == 0
    err = capsys.readouterr().err
    assert f"bi-rollout: wrote 1 sample to {one} (" in err, err
    assert main(_loud(setup, tmp_path / "q.jsonl", "--n", "1", "--limit", "1", "-q")) == 0
    assert capsys.readouterr().err == ""  # -q is --quiet
    full = tmp_path / "full.jsonl"
    assert main(_args(setup, full)) == 0
    lines = full.read_bytes().splitlines(keepends=True)
    part = tmp_path / "part.jsonl"
    part.write_bytes(b"".join(lines[:6]))  # the header and 5 of 12 records
    new_tokens = sum(len(r.tokens) for r in read_log(full)[1][5:])
    capsys.readouterr()
    assert main(_loud(setup, part, "--resume")) == 0
    err = capsys.readouterr().err
    want = f"bi-rollout: resumed {part} at 5 of 12 samples: wrote 7 new samples ({new_tokens} "
    assert want + "tokens in" in err, err
    assert main(_loud(setup, part, "--resume")) == 0
    err = capsys.readouterr().err
    assert err == f"bi-rollout: {part} is already complete (12 of 12 samples); nothing to do\n"
    if Path("/dev/full").exists():
        err = _error(setup, tmp_path, capsys, _args(setup, "/dev/full"))
        assert "'/dev/full' is not a regular file" in err and "File exists" not in err
    missing = tmp_path / "missing.jsonl"
    err = _error(setup, tmp_path, capsys, _args(setup, missing, "--resume"))
    assert "no such file: nothing to resume" in err and not missing.exists()
    empty = tmp_path / "empty.jsonl"
    empty.write_bytes(b"")
    err = _error(setup, tmp_path, capsys, _args(setup, empty, "--resume"))
    assert "is empty: nothing to resume" in err and empty.read_bytes() == b""

    import errno

    from bi_rl.rollout.log import LogWriter

    def full_disk(self, samples):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(LogWriter, "write", full_disk)
    err = _error(setup, tmp_path, capsys, _args(setup, tmp_path / "nospace.jsonl"))
    assert f"cannot write {str(tmp_path / 'nospace.jsonl')!r}: No space left on device" in err
    assert not (tmp_path / "nospace.jsonl").exists()


def test_characters_the_tokenizer_drops_are_named_once(tmp_path, monkeypatch, capsys):
    """The embedded tokenizer knows digits, + and = only and drops the rest: a run says so
    once, naming the dropped characters, and still runs."""
    rows = [{"id": "a", "prompt": "héllo wörld 1+2="}, {"id": "b", "prompt": "ö 3+4="}]
    prompts = write_jsonl(tmp_path / "p.jsonl", rows)
    monkeypatch.chdir(tmp_path)
    assert main(["--prompts", str(prompts), "--quiet"]) == 0
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("bi-rollout: warning: the tokenizer drops"), err
    for c in "héllowörd ":
        assert repr(c) in err
    assert "in 2 of 2 prompts, first 'a'" in err


def test_a_log_another_run_is_writing_is_left_alone(setup, tmp_path, capsys, held):
    """While another process holds a log's write lock (a run in progress), --resume,
    --overwrite and a plain run on it are refused in one line before any work, the log kept."""
    out = tmp_path / "o.jsonl"
    assert main(_args(setup, out)) == 0
    before = out.read_bytes()
    proc = held(out)
    for extra in (["--resume"], ["--overwrite"], []):
        err = _error(setup, tmp_path, capsys, _args(setup, out, *extra))
        assert "another process is writing this log" in err, (extra, err)
    assert out.read_bytes() == before
    proc.stdin.close()
    proc.wait(timeout=30)
    assert main(_args(setup, out, "--overwrite")) == 0
