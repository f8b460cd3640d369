"""Test helpers: make small rollout logs with bi-rollout, and tamper with them.

Tampering works on the JSONL lines as the writer emits them (orjson, sorted keys), so an
untouched line stays byte-identical; `rechain` plays a forger who recomputes every hash
after an edit, which the chain alone cannot catch.
"""

from __future__ import annotations

import re
from pathlib import Path

import orjson

from bi_rl.rollout.run import RolloutConfig, rollout
from bi_rl.rollout.sampler import SamplerConfig
from bi_rl.rollout.schema import chain_record, genesis_hash, header_digest

ADDITION_ROWS = [{"id": f"q{i}", "prompt": f"{i * 37 % 1000}+{i * 91 % 1000}="} for i in range(8)]


def cpu_without_gathers():
    """The CPU backend less its MoE gathers: strict mode refuses a mixture-of-experts model
    there, fallback mode runs it (stock gathers, with a warning). Its name stays "cpu", so a
    log made with it matches this machine's backend."""
    from bi_rl import backends
    from bi_rl.backends import Backend

    ops = {k: f for k, f in backends.get("cpu").ops.items() if not k.startswith("gather")}
    return Backend("cpu", ops)


def make_log(
    out: Path,
    model: Path,
    prompts: Path,
    *,
    n=2,
    max_tokens=6,
    limit=4,
    seed=0,
    batch_size=8,
    temperature=1.0,
    mode="strict",
) -> Path:
    from bi_rl.rollout.engine import EngineConfig

    cfg = RolloutConfig(
        model=str(model),
        prompts=str(prompts),
        out=str(out),
        limit=limit,
        sampler=SamplerConfig(temperature=temperature, seed=seed),
        engine=EngineConfig(n=n, max_tokens=max_tokens, batch_size=batch_size, mode=mode),
    )
    rollout(cfg)
    return out


def read_lines(path: Path) -> list[bytes]:
    return path.read_bytes().splitlines(keepends=True)


def write_lines(path: Path, lines: list[bytes]) -> Path:
    path.write_bytes(b"".join(lines))
    return path


def load(line: bytes) -> dict:
    return orjson.loads(line)


def dump(obj: dict) -> bytes:
    return orjson.dumps(obj, option=orjson.OPT_SORT_KEYS) + b"\n"


def reseal_header(h: dict, *, genesis: bool = False) -> dict:
    """Recompute the header's digest (and genesis) after an edit, as a forger would."""
    if genesis:
        h["genesis"] = genesis_hash(h["run"])
    h["digest"] = header_digest(h)
    return h


def rechain(lines: list[bytes]) -> list[bytes]:
    """Recompute every record's hashes from the header's genesis on."""
    header = load(lines[0])
    prev = header["genesis"]
    out = [lines[0]]
    for raw in lines[1:]:
        rec = load(raw)
        rec["hashes"], rec["hash"] = chain_record(prev, rec)
        prev = rec["hash"]
        out.append(dump(rec))
    return out


def committed_logs(root: Path) -> list[Path]:
    """The reference logs under rollouts/ that rollouts/README.md names (not a user's own
    runs, such as bi-rollout's default rollouts/run.jsonl)."""
    folder = root / "rollouts"
    if not (folder / "README.md").is_file():
        return []
    named = set(re.findall(r"[\w.-]+\.jsonl", (folder / "README.md").read_text()))
    return sorted(p for p in folder.glob("**/*.jsonl") if p.name in named)
