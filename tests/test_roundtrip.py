"""bi-verify --model: the round trip on a user's model passes, fails and refuses as it should.

Properties: on a sliding-window model the rollout (batch 8) and the shuffled rescoring (batch
3) agree bitwise in strict mode, with prompt lengths on both sides of the window, and stock
MLX (the control) is reported as a finding on the CPU; under a backend whose GEMM bits
depend on the batch size the same command finds differing tokens and exits 1 (the check can
fail); strict mode meeting an op it cannot make invariant exits 1 with the refusal, naming
the layer; a missing model is one line, exit 2.
"""

from __future__ import annotations

import mlx_lm
import orjson
import pytest
from conftest import MARK
from log_tools import cpu_without_gathers
from tiny_models import build_model

from bi_rl import _stock, backends
from bi_rl.backends import Backend
from bi_rl.cli import verify as cli
from bi_rl.verify.roundtrip import RoundTripConfig, context_lengths, prompt_lengths, round_trip

FAST = ["--prompts", "5", "--new-tokens", "10"]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("roundtrip")
    return {
        "gemma3_text": build_model(root / "gemma3", "gemma3_text"),
        "mixtral": build_model(root / "mixtral", "mixtral"),
    }


def test_prompt_lengths_straddle_the_window_and_respect_the_cap():
    lengths = prompt_lengths((8, None), 8, 2048)
    assert {7, 8, 9} <= set(lengths) and min(lengths) == 1
    assert {63, 64, 65} <= set(prompt_lengths((None,), 8, 2048))
    assert max(prompt_lengths((512,), 12, 100)) == 100


def test_context_lengths_make_every_sample_cross_the_context():
    for count, new in ((1, 2), (2, 2), (4, 32), (8, 32), (3, 5)):
        lengths = context_lengths(4096, count, new)
        assert len(lengths) == count and max(lengths) == 4095
        # a prompt of L tokens and `new` tokens reach L + new - 1 keys at the last step
        assert all(length < 4096 <= length + new - 1 for length in lengths), (count, new)
    with pytest.raises(ValueError, match="context"):
        RoundTripConfig(context=32, new_tokens=32)


def test_context_option_sets_the_prompt_lengths(models, capsys, tmp_path):
    report = tmp_path / "rt.json"
    rc = cli.main(
        ["--model", str(models["mixtral"]), *FAST, "--context", "40", "--json", str(report)]
    )
    assert rc == 0, capsys.readouterr().out
    js = orjson.loads(report.read_bytes())
    assert js["ok"] and js["mode"]["differing"] == 0
    assert js["config"]["context"] == 40
    assert max(js["prompt_lengths"]) == 39 and all(n < 40 for n in js["prompt_lengths"])


def test_passes_on_a_sliding_window_model(models, capsys, tmp_path):
    report = tmp_path / "rt.json"
    rc = cli.main(["--model", str(models["gemma3_text"]), *FAST, "--json", str(report)])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "gemma3_text (mlx-lm" in out and "sliding window of 8" in out
    assert "PASS: rollout and rescoring agree bitwise in mode strict" in out
    assert "Finding: stock MLX was itself exact on the cpu backend" in out
    js = orjson.loads(report.read_bytes())
    assert js["ok"] and js["mode"]["differing"] == 0 and js["mode"]["tokens"] == 50
    assert js["control"]["mode"] == "off" and js["control"]["tokens"] == 50
    assert js["windows"] == [8, None] and max(js["prompt_lengths"]) > 8


def _row_count_sensitive_cpu() -> Backend:
    """The CPU backend with a linear whose bits depend on how many rows share the call."""

    def linear(x, w, bias=None):
        rows = x.size // x.shape[-1]
        return _stock.linear(x, w, bias) * (1 + rows / MARK)

    return Backend("cpu", {**backends.get("cpu").ops, "linear": linear})


def test_fails_when_the_gemm_depends_on_the_batch(models, capsys):
    with backends.use(_row_count_sensitive_cpu()):
        rc = cli.main(["--model", str(models["gemma3_text"]), *FAST, "--no-control"])
    out = capsys.readouterr().out
    assert rc == 1 and "FAIL: the round trip in mode strict is not exact" in out, out
    assert "first at prompt" in out


@pytest.mark.filterwarnings("ignore::bi_rl.BatchVariantWarning")
def test_a_refusal_fails_and_names_the_layer_and_fallback_runs(models, capsys):
    with backends.use(cpu_without_gathers()):
        rc = cli.main(["--model", str(models["mixtral"]), *FAST, "--no-control"])
        out = capsys.readouterr().out
        assert rc == 1 and "mode strict: REFUSED: bi_rl: gather_mm" in out, out
        assert "in layer model.layers.0.block_sparse_moe.switch_mlp." in out
        model, tok = mlx_lm.load(str(models["mixtral"]))
        res = round_trip(model, tok, RoundTripConfig(prompts=3, new_tokens=6, mode="fallback"))
    assert res.ok and res.mode.tokens == 18 and res.control.ok


def test_a_missing_model_is_one_line(capsys, tmp_path):
    assert cli.main(["--model", str(tmp_path / "nothing")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "no such directory" in err
