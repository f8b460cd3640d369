"""README.md: its commands work as written, in the order a new user meets them.

Properties: the quick start's first command creates and activates a virtual environment
before installing (a system Python may refuse pip installs) and ends by running bi-rollout;
its second command is the test command CI runs; every command of "Rescoring, audit and the
trainer" runs with exit 0 right after the quick start (so none collides with the log the
quick start wrote); the "Reading a log" snippets turn a record into float32 logprobs bit for
bit equal to the reader's; the sidecar LOG.run.json is documented.
"""

import re
import shlex
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def _section(title: str) -> str:
    m = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## )", README, re.S | re.M)
    assert m, f"README.md has no section {title!r}"
    return m.group(1)


def _blocks(text: str, lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", text, re.S)


def _commands(block: str) -> list[str]:
    lines = [re.sub(r"\s+#.*$", "", x).strip() for x in block.splitlines()]
    return [x for x in lines if x and not x.startswith("#")]


def test_quick_start_installs_into_a_venv_and_ci_runs_its_test_command():
    first, second = _commands(_blocks(_section("Quick start"), "bash")[0])
    steps = [s.strip() for s in first.split("&&")]
    assert steps[0] == "python3 -m venv .venv" and steps[1] == ". .venv/bin/activate", steps
    assert any(s.startswith("pip install") or "-m pip install" in s for s in steps[2:-1])
    assert steps[-1] == "bi-rollout"
    ci = [x.split("#")[0].strip() for x in (ROOT / ".ci" / "run").read_text().splitlines()]
    assert second in ci, f".ci/run does not run the README's test command {second!r}"


def test_rescoring_and_audit_commands_run_after_the_quick_start(tmp_path, monkeypatch, capsys):
    from bi_rl.cli import audit, rescore, rollout

    mains = {"bi-rollout": rollout.main, "bi-rescore": rescore.main, "bi-audit": audit.main}
    monkeypatch.chdir(tmp_path)
    assert rollout.main(["--quiet"]) == 0  # the quick start's bi-rollout
    block = _blocks(_section("Rescoring, audit and the trainer"), "bash")[0]
    for line in _commands(block):
        for step in line.split("&&"):
            prog, *argv = shlex.split(step)
            assert mains[prog](argv) == 0, f"README: {step.strip()!r} failed"
    capsys.readouterr()


def test_reading_a_log_gives_the_exact_logprobs(tmp_path, monkeypatch):
    import datasets

    from bi_rl.cli import rollout
    from bi_rl.rollout import read_log

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf-cache")
    assert rollout.main(["--quiet", "--limit", "2"]) == 0
    want = read_log("rollouts/run.jsonl")[1][0].logprobs.view(np.uint32)
    snippets = _blocks(_section("Reading a log"), "python")
    assert len(snippets) >= 2, "the bi_rl way and the plain orjson/numpy way"
    for code in snippets:
        scope: dict = {}
        exec(code, scope)
        lp = scope["logprobs"]
        assert lp.dtype == np.float32 and np.array_equal(lp.view(np.uint32), want), code


def test_the_sidecar_is_documented():
    quick = _section("Quick start")
    assert "rollouts/run.jsonl.run.json" in quick and "LOG.run.json" in quick
