"""bi-train: the loop end to end, checkpoints, resume, logs as batches, bad input.

Properties: on the embedded adder every step's gate finds 0 differing tokens, k3 exactly 0
and first-update ratios exactly 1, and the adapters load in mlx-lm; a LoRA run on a
random-weight Qwen3 with a reward function from a file does the same; a run killed after
a checkpoint (a torn metrics line left behind) and resumed writes the same adapter,
optimizer and metrics bytes as an uninterrupted run; a bi-rollout log of the base model
trains as the first batch (rewards from a file keyed by record hash), and a second log of
the same base model, no longer the policy after that update, stops the run with exit 1
naming the first divergent token; an existing checkpoint directory without --resume, a
changed configuration on --resume, a missing reward function and a rewards file that does
not fit its log are refused with one line and exit 2, touching no file.
"""

import json
from pathlib import Path

import mlx_lm
import pytest
from log_tools import ADDITION_ROWS, make_log
from tiny_models import build_model, write_jsonl

from bi_rl.cli.train import main
from bi_rl.rollout.log import read_log
from bi_rl.score.dataset import write_rewards

SMALL = ["--prompts-per-step", "3", "--n", "2", "--lr", "1e-3", "--quiet"]


def _metrics(adapters: Path) -> list[dict]:
    return [json.loads(line) for line in (adapters / "metrics.jsonl").read_text().splitlines()]


def _exactly_on_policy(rows):
    for r in rows:
        assert r["tokens"] > 0 and r["differing"] == 0, r
        assert r["k3_mean"] == r["k3_max"] == 0.0, r
        assert r["ratio_first_not_1"] == 0 and r["ratio_first_min"] == r["ratio_first_max"] == 1.0


def _one_line(capsys, argv, code, *needles):
    rc = main(argv)
    err = capsys.readouterr().err.strip()
    assert rc == code, (rc, err)
    assert len(err.splitlines()) == 1, err
    for n in needles:
        assert n in err, err
    return err


def test_embedded_adder_steps_are_exactly_on_policy(tmp_path):
    out = tmp_path / "ad"
    assert main([*SMALL, "--steps", "2", "--adapter-path", str(out)]) == 0
    rows = _metrics(out)
    assert [r["step"] for r in rows] == [1, 2] and all(r["source"] == "generated" for r in rows)
    _exactly_on_policy(rows)
    assert any(r["grad_norm"] > 0 for r in rows)
    state = json.loads((out / "train_state.json").read_text())
    assert state["step"] == 2 and (out / "0000002_adapters.safetensors").is_file()
    from bi_rl.assets import DEFAULT_MODEL

    mlx_lm.load(str(DEFAULT_MODEL), adapter_path=str(out))  # mlx-lm reads the format


def test_lora_on_a_random_qwen3_with_a_reward_file(tmp_path):
    model = build_model(tmp_path / "q3", arch="qwen3", hidden=64, heads=1)
    prompts = write_jsonl(tmp_path / "p.jsonl", ADDITION_ROWS)
    reward = tmp_path / "my_reward.py"
    reward.write_text("def score(tokens, **_):\n    return sum(t % 2 for t in tokens)\n")
    out = tmp_path / "ad"
    argv = [
        "--model",
        str(model),
        "--prompts",
        str(prompts),
        "--reward",
        f"{reward}:score",
        "--max-tokens",
        "5",
        "--steps",
        "2",
        "--epochs",
        "2",
        "--adapter-path",
        str(out),
        *SMALL,
    ]
    assert main(argv) == 0
    rows = _metrics(out)
    _exactly_on_policy(rows)
    assert all(r["updates"] == 2 for r in rows)
    assert any(r["reward_max"] > r["reward_min"] for r in rows), "guard: rewards vary"


def test_resume_writes_the_bytes_of_an_uninterrupted_run(tmp_path):
    whole, part = tmp_path / "whole", tmp_path / "part"
    common = [*SMALL, "--save-every", "2", "--seed", "3"]
    assert main([*common, "--steps", "4", "--adapter-path", str(whole)]) == 0
    assert main([*common, "--steps", "3", "--adapter-path", str(part)]) == 0
    # Killed during step 4 after a torn write; the last checkpoint is step 3's.
    with open(part / "metrics.jsonl", "ab") as f:
        f.write(b'{"step": 4, "tor')
    assert main([*common, "--steps", "4", "--adapter-path", str(part), "--resume"]) == 0
    for name in (
        "adapters.safetensors",
        "0000004_adapters.safetensors",
        "0000004_optimizer.safetensors",
        "metrics.jsonl",
    ):
        assert (whole / name).read_bytes() == (part / name).read_bytes(), name
    assert [r["step"] for r in _metrics(part)] == [1, 2, 3, 4]


def test_logs_train_as_batches_and_an_off_policy_log_stops_the_run(tmp_path, capsys):
    model = build_model(tmp_path / "m", hidden=64, heads=1)
    prompts = write_jsonl(tmp_path / "p.jsonl", ADDITION_ROWS)
    logs = [
        make_log(tmp_path / f"r{i}.jsonl", model, prompts, n=3, max_tokens=5, limit=3, seed=i)
        for i in range(2)
    ]
    rewards = []
    for i, log in enumerate(logs):
        _, recs = read_log(log)
        rewards.append(
            write_rewards(
                tmp_path / f"rw{i}.jsonl", [r.hash for r in recs], [j % 3 for j in range(len(recs))]
            )
        )
    out = tmp_path / "ad"
    argv = [
        "--model",
        str(model),
        "--rollouts",
        str(logs[0]),
        "--rewards",
        str(rewards[0]),
        "--epochs",
        "2",
        "--adapter-path",
        str(out),
        *SMALL,
    ]
    assert main(argv) == 0
    (row,) = _metrics(out)
    _exactly_on_policy([row])
    assert row["source"] == str(logs[0]) and row["updates"] == 2
    out2 = tmp_path / "ad2"
    argv = [
        "--model",
        str(model),
        "--rollouts",
        *map(str, logs),
        "--rewards",
        *map(str, rewards),
        "--adapter-path",
        str(out2),
        *SMALL,
    ]
    err = _one_line(
        capsys,
        argv,
        1,
        "bi-train: stopped: off-policy batch, no update taken",
        "first at prompt 'q0' (index 0), sample 0, position 0 (token ",
    )
    assert "rollout -" in err and "trainer -" in err
    assert [r["step"] for r in _metrics(out2)] == [1], "step 1 trained, step 2 refused"


def test_bad_input_is_refused_with_one_line(tmp_path, capsys):
    out = tmp_path / "ad"
    assert main([*SMALL, "--steps", "1", "--adapter-path", str(out)]) == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    _one_line(
        capsys,
        [*SMALL, "--steps", "1", "--adapter-path", str(out)],
        2,
        "already holds adapters; pass --resume",
    )
    _one_line(
        capsys,
        [*SMALL, "--steps", "2", "--lr", "5e-4", "--adapter-path", str(out), "--resume"],
        2,
        "cannot resume: the configuration differs in lr",
    )
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before, "files untouched"
    _one_line(
        capsys,
        [*SMALL, "--adapter-path", str(tmp_path / "new"), "--resume"],
        2,
        "nothing to resume",
    )
    for spec, needle in (
        ("no_such_module_xyz:f", "importing no_such_module_xyz failed"),
        (f"{tmp_path}/none.py:f", "no such file"),
        ("math:nope", "math has no attribute 'nope'"),
        ("math:sqrt", "parameter 'x' is not one bi-train passes"),
    ):
        _one_line(
            capsys, [*SMALL, "--reward", spec, "--adapter-path", str(tmp_path / "x")], 2, needle
        )
    assert not (tmp_path / "x").exists()


@pytest.fixture
def adder_log(tmp_path):
    from bi_rl.assets import DEFAULT_MODEL, DEFAULT_PROMPTS

    return make_log(tmp_path / "run.jsonl", DEFAULT_MODEL, DEFAULT_PROMPTS, n=2, limit=2)


def test_a_rewards_file_that_does_not_fit_its_log_is_refused(adder_log, tmp_path, capsys):
    _, recs = read_log(adder_log)
    bad = write_rewards(tmp_path / "rw.jsonl", [r.hash for r in recs[1:]], [1.0] * 3)
    _one_line(
        capsys,
        [
            "--rollouts",
            str(adder_log),
            "--rewards",
            str(bad),
            "--adapter-path",
            str(tmp_path / "ad"),
            *SMALL,
        ],
        2,
        "1 of 4 records",
        "have no reward",
    )
    assert not (tmp_path / "ad").exists()
