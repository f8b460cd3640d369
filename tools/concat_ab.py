"""Sibling projections as one product over concatenated weights (bi_rl.concat) timed
against the model as it is, in both modes, on bi-bench's end-to-end workload.

    PYTHONPATH=. python tools/concat_ab.py [--workload qwen3-1.7b] [--model-dir DIR] \
        [--models bf16,4-bit] [--batches 1,8,64] [--modes off,strict] [--sets 1,mlp] \
        [--steps 64] [--repeats 3] [--json out.json]

A decode step of a Qwen3-shaped model runs seven projections a layer; with
`bi_rl.concat.concatenated` q/k/v are one product and gate/up another (the engine and the
scorer do this as bi_rl.concat.chosen_sets says; the tool's plain side runs with
BI_RL_CONCAT_PROJECTIONS=0). In `--mode off` each projection is a stock
cuBLAS (or stock quantized) call, and MLX's host time to queue a step grows with those calls;
in strict mode the invariant GEMM must give the members' bits exactly (the tool checks it;
with stock kernels in `--mode off` it reports how many logits differ instead).

For each model and batch the tool prefills the workload's prompts and times the bare decode
step (bi_rl.bench.e2e.bare_step: the model alone, its argmax fed back, step t + 1 queued
before step t is read) with the layers as they are and concatenated, rotating the order
within each repeat, per mode; it prints the median step of each and their ratio
(concatenated over plain; below 1 the concatenation is faster). `--sets` names the arms, as
BI_RL_CONCAT_PROJECTIONS takes them (bi_rl.concat.CHOICES): 1 every set, attention q/k/v
alone, mlp gate/up alone. Past one row a member's columns are a strided view, which MLX's
RMSNorm copies before its kernel (Qwen3's q and k) and the MLP's elementwise gate reads as
it is, so the arms can differ in sign.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import nullcontext
from pathlib import Path
from typing import TypeVar

import mlx.core as mx
import numpy as np

from bi_rl.concat import CHOICES, CONCAT_ENV, concatenated

T = TypeVar("T")


def first_logits(model, prompts, mode: str):
    """The logits of the first decode step after prefilling the prompts, as numpy bits."""
    from bi_rl.bench import e2e
    from bi_rl.mode import named_mode

    batch = e2e.prefilled(model, prompts, mode)
    with named_mode(mode):
        logits = model(batch.y[:, None], cache=batch.caches)[:, -1, :]
        mx.eval(logits)
    return np.array(logits.astype(mx.float32)).view(np.uint32)


def compare(model, prompts, mode: str, sets) -> dict:
    """Concatenated against plain logits of one decode step: how many differ in bits."""
    plain = first_logits(model, prompts, mode)
    with concatenated(model, sets=sets) as n:
        joined = first_logits(model, prompts, mode)
    return {"logits": int(plain.size), "differ": int((plain != joined).sum()), "sets": n}


def alternated(names: list[str], run: Callable[[str, bool], T], repeats: int) -> dict[str, list[T]]:
    """Each name's results of `repeats` calls run(name, False), the order rotated by one name
    every round (A B C, B C A, ...) so that drift hits every side alike, after one warm-up
    call run(name, True) of each (kernels compiled, allocator sized). The bare-step tools'
    (and tools/score_parts.py's) one schedule."""
    for name in names:
        run(name, True)
    out = {name: [] for name in names}
    for r in range(repeats):
        k = r % len(names)
        for name in names[k:] + names[:k]:
            out[name].append(run(name, False))
    return out


def spread(xs: list[float]) -> float:
    """(max - min) / median of a side's timings."""
    return (max(xs) - min(xs)) / statistics.median(xs)


def time_batch(model, prompts, mode: str, arms: dict, steps: int, repeats: int) -> dict:
    """Median bare-step seconds, plain and each arm (name -> sets) concatenated, the order
    rotated between repeats."""
    from bi_rl.bench import e2e

    def side(name: str, warm: bool) -> float:
        with concatenated(model, sets=arms[name]) if name != "plain" else nullcontext():
            return e2e.bare_step(model, prompts, mode, 4 if warm else steps)["step"]

    times = alternated(["plain", *arms], side, repeats)
    med = {k: statistics.median(v) for k, v in times.items()}
    return {
        "median_ms": {k: v * 1e3 for k, v in med.items()},
        "spread": max(spread(v) for v in times.values()),
    }


def workload_parser(doc: str, models: str) -> argparse.ArgumentParser:
    """The parser of a workload tool (this one, tools/off_step_parts.py, tools/score_parts.py)
    described by its module doc `doc`, with their shared arguments: the workload, its model
    files, models (default `models`), batches, steps, repeats and the JSON output."""
    from bi_rl.bench import e2e

    p = argparse.ArgumentParser(
        description=doc.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--workload", default="qwen3-1.7b", choices=sorted(e2e.WORKLOADS))
    p.add_argument("--model-dir", type=Path, default=None)
    p.add_argument("--models", default=models, help=f"comma-separated: {e2e.MODELS_TEXT}")
    p.add_argument("--batches", default="1,8,64")
    p.add_argument("--steps", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--json", type=Path, default=None)
    return p


def arm_medians(runs: list[dict], keys, by: str) -> dict:
    """Each of `keys`' median over an arm's timed runs (seconds each) in ms, and the spread of
    the runs' `by` (the tools' per-arm figures)."""
    out = {k: 1e3 * statistics.median(x[k] for x in runs) for k in keys}
    out["spread"] = spread([x[by] for x in runs])
    return out


def workload_args(args) -> tuple[tuple[str, ...], list[int]]:
    """(models, batches) of workload_parser's arguments, checked: ValueError naming the bad
    one."""
    from bi_rl.bench import e2e

    models = tuple(m for m in args.models.split(",") if m)
    e2e.check_models(models)
    batches = [int(b) for b in args.batches.split(",") if b]
    if not batches or min(batches) < 1 or args.steps < 1 or args.repeats < 1:
        raise ValueError("--batches, --steps and --repeats must be >= 1")
    return models, batches


def each_batch(args, models, batches) -> Iterator[tuple[str, object, int]]:
    """(label, model, batch) for every model and batch size workload_parser's arguments
    name, the model files in --model-dir or, without it, a temporary directory for the run."""
    from bi_rl.bench import e2e

    w = e2e.WORKLOADS[args.workload]
    with tempfile.TemporaryDirectory() as tmp:
        for label, model, _ in e2e.each_model(w, args.model_dir, tmp, models=models):
            for b in batches:
                yield label, model, b


def write_rows(args, rows: list[dict]) -> None:
    """The rows as JSON where --json names a file."""
    if args.json:
        args.json.write_text(json.dumps({"workload": args.workload, "rows": rows}, indent=1))


def setup_arg_parser() -> argparse.ArgumentParser:
    p = workload_parser(__doc__, "bf16,4-bit")
    p.add_argument("--modes", default="off,strict")
    p.add_argument(
        "--sets",
        default="1",
        help="comma-separated arms, as BI_RL_CONCAT_PROJECTIONS: 1, attention, mlp",
    )
    return p


def main(argv=None) -> int:
    from bi_rl.bench import e2e

    args = setup_arg_parser().parse_args(argv)
    try:
        models, batches = workload_args(args)
        modes = [m for m in args.modes.split(",") if m]
        if any(m not in e2e.MODES for m in modes):
            raise ValueError(f"--modes takes {', '.join(e2e.MODES)}, got {args.modes!r}")
        arms = {a: CHOICES.get(a) for a in args.sets.split(",") if a}
        if not arms or not all(arms.values()):
            raise ValueError(f"--sets takes 1, attention, mlp, got {args.sets!r}")
    except ValueError as e:
        print(f"concat_ab: {e}", file=sys.stderr)
        return 2
    if os.environ.get(CONCAT_ENV, "0") != "0":
        print(f"concat_ab: unset {CONCAT_ENV}: the plain side must run as it is", file=sys.stderr)
        return 2
    os.environ[CONCAT_ENV] = "0"  # the plain side unconcatenated in the mode too (bare_step)
    w = e2e.WORKLOADS[args.workload]
    rows = []
    for label, model, b in each_batch(args, models, batches):
        prompts = e2e.make_prompts(b, w.prompt_lens, w.shape["vocab_size"], seed=b)
        for mode in modes:
            row = {"model": label, "batch": b, "mode": mode}
            row |= time_batch(model, prompts, mode, arms, args.steps, args.repeats)
            row["arms"] = {a: compare(model, prompts, mode, arms[a]) for a in arms}
            rows.append(row)
            med = row["median_ms"]
            line = f"{label:6} B={b:<3} {mode:6} plain {med['plain']:7.2f} ms"
            for a, cmp in row["arms"].items():
                line += (
                    f" | {a}: {med[a]:7.2f} ms, /plain {med[a] / med['plain']:.3f}, "
                    f"{cmp['sets']} sets, logits differing {cmp['differ']} of "
                    f"{cmp['logits']}"
                )
            print(f"{line}  spread {row['spread']:.2f}", flush=True)
    write_rows(args, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
