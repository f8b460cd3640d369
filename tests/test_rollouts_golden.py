"""rollouts/: the committed golden logs, re-made and compared hash for hash.

On the CPU: the embedded default's logs (names with "cpu"). On CUDA: the H200 logs (names
with "h200") of the random-weight 0.5B-shaped Qwen2 that tools/make_qwen2_05b.py writes,
built first where the path the command names is missing.

Properties: the golden log passes its own integrity checks (header digest, genesis, chain);
running the command rollouts/README.md records for it, on this CPU, reproduces the same run
header and the same records token for token (tokens, logprob bits, fingerprints, chained
hashes), so a change anywhere (MLX, mlx-lm, the model files, the sampler, the log format)
that moves a single bit fails here, naming the first divergent sample and token.
"""

import re
import shlex
from pathlib import Path

import mlx.core as mx
import pytest
from conftest import ensure_qwen2_05b

from bi_rl.cli.rollout import main
from bi_rl.rollout.log import read_log

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "rollouts" / "README.md"

ON_CPU = mx.default_device().type == mx.DeviceType.cpu


def _golden_commands():
    """(log path, argv) of every `bi-rollout ... --out rollouts/X.jsonl` line of the README."""
    out = []
    for line in README.read_text().splitlines():
        m = re.match(r"^\s*bi-rollout\s(.*--out\s+(rollouts/\S+\.jsonl).*)$", line)
        if m:
            out.append((ROOT / m.group(2), shlex.split(m.group(1))))
    return out


GOLDEN = [(p, argv) for p, argv in _golden_commands() if ("cpu" if ON_CPU else "h200") in p.name]
ALL_LOGS = [p for p, _ in _golden_commands()]


def _ensure_model(argv: list[str]) -> None:
    if "--model" in argv:
        ensure_qwen2_05b(argv[argv.index("--model") + 1])


@pytest.mark.parametrize("path", ALL_LOGS, ids=[p.name for p in ALL_LOGS])
def test_every_recorded_log_is_committed_and_intact(path):
    header, records = read_log(path)  # verifies the header digest and the whole hash chain
    assert records and header.env.backend in path.name.replace("h200", "cuda")


def test_readme_records_a_cpu_golden_log():
    assert GOLDEN, "rollouts/README.md must record the command of a CPU golden log"
    for path, _ in GOLDEN:
        assert path.is_file(), f"{path} is missing"


def _compare(path: Path, out: Path) -> None:
    gold_header, gold = read_log(path)
    header, again = read_log(out)
    assert header.run == gold_header.run, "the run settings or digests changed"
    for g, a in zip(gold, again, strict=False):
        where = f"sample {g.prompt_id!r}/{g.sample}"
        assert a.prompt_tokens == g.prompt_tokens, f"{where}: prompt tokens differ"
        for i, (x, y) in enumerate(zip(g.hashes, a.hashes, strict=False)):
            assert x == y, (
                f"{where} diverges at token {i}: golden (token {g.tokens[i]}, logprob bits "
                f"{g.logprob_bits[i]:#010x}, fingerprint {g.fingerprints[i]:#018x}) vs now "
                f"(token {a.tokens[i]}, {a.logprob_bits[i]:#010x}, {a.fingerprints[i]:#018x})"
            )
        assert (a.tokens, a.finish, a.hash) == (g.tokens, g.finish, g.hash), f"{where} differs"
    assert len(again) == len(gold)
    assert out.read_bytes().split(b"\n", 1)[1] == path.read_bytes().split(b"\n", 1)[1]


def _rerun(path: Path, argv: list[str], out: Path) -> None:
    argv = [str(out) if a == str(path.relative_to(ROOT)) else a for a in argv]
    assert main([*argv, "--quiet"]) == 0


@pytest.mark.parametrize("path,argv", GOLDEN, ids=[p.name for p, _ in GOLDEN])
def test_golden_log_regenerates_hash_for_hash(path, argv, tmp_path):
    _ensure_model(argv)
    out = tmp_path / path.name
    _rerun(path, argv, out)
    _compare(path, out)


@pytest.mark.skipif(not ON_CPU, reason="uses the CPU's golden log of the embedded model")
def test_a_one_ulp_weight_change_is_caught(tmp_path, monkeypatch):
    """Negative control: the same files but one weight nudged by one ULP in memory."""
    import numpy as np

    from bi_rl.rollout import run

    real = run.load_model

    def nudged(path):
        model, tok = real(path)
        w = np.array(model.model.embed_tokens.weight)
        w[4, 0] = np.nextafter(w[4, 0], np.float32(np.inf))
        model.model.embed_tokens.weight = mx.array(w)
        return model, tok

    monkeypatch.setattr(run, "load_model", nudged)
    path, argv = GOLDEN[0]
    out = tmp_path / path.name
    _rerun(path, argv, out)
    with pytest.raises(AssertionError, match="diverges at token 0"):
        _compare(path, out)
