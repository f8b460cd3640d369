"""Sibling projections as one product over concatenated weights (bi_rl.concat) timed
against the model as it is, in both modes, on bi-bench's end-to-end workload.

    PYTHONPATH=. python tools/concat_ab.py [--workload qwen3-1.7b] [--model-dir DIR] \
        [--models bf16,4-bit] [--batches 1,8,64] [--modes off,strict] [--steps 64] \
        [--repeats 3] [--json out.json]

A decode step of a Qwen3-shaped model runs seven projections a layer; with
`bi_rl.concat.concatenated` q/k/v are one product and gate/up another (the engine and the
scorer do this where BI_RL_CONCAT_PROJECTIONS=1). In `--mode off` each projection is a stock
cuBLAS (or stock quantized) call, and MLX's host time to queue a step grows with those calls;
in strict mode the invariant GEMM must give the members' bits exactly (the tool checks it;
with stock kernels in `--mode off` it reports how many logits differ instead).

For each model and batch the tool prefills the workload's prompts and times the bare decode
step (bi_rl.bench.e2e.bare_step: the model alone, its argmax fed back, step t + 1 queued
before step t is read) with the layers as they are and concatenated, alternating the two
within each repeat, per mode; it prints the median step of each and their ratio
(concatenated over plain; below 1 the concatenation is faster).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from contextlib import nullcontext
from pathlib import Path

import mlx.core as mx
import numpy as np

from bi_rl.concat import CONCAT_ENV, concatenated


def first_logits(model, prompts, mode: str):
    """The logits of the first decode step after prefilling the prompts, as numpy bits."""
    from bi_rl.bench import e2e
    from bi_rl.mode import named_mode

    batch = e2e.prefilled(model, prompts, mode)
    with named_mode(mode):
        logits = model(batch.y[:, None], cache=batch.caches)[:, -1, :]
        mx.eval(logits)
    return np.array(logits.astype(mx.float32)).view(np.uint32)


def compare(model, prompts, mode: str) -> dict:
    """Concatenated against plain logits of one decode step: how many differ in bits."""
    plain = first_logits(model, prompts, mode)
    with concatenated(model) as sets:
        joined = first_logits(model, prompts, mode)
    return {"logits": int(plain.size), "differ": int((plain != joined).sum()), "sets": sets}


def time_batch(model, prompts, mode: str, steps: int, repeats: int) -> dict:
    """Median bare-step seconds, plain and concatenated, alternating which runs first."""
    from bi_rl.bench import e2e

    def side(name: str, n: int) -> float:
        with concatenated(model) if name == "concat" else nullcontext():
            return e2e.bare_step(model, prompts, mode, n)["step"]

    times = {"plain": [], "concat": []}
    for name in times:  # warm-up: kernels compiled, allocator sized
        side(name, 4)
    for r in range(repeats):
        for name in ("plain", "concat") if r % 2 == 0 else ("concat", "plain"):
            times[name].append(side(name, steps))
    med = {k: statistics.median(v) for k, v in times.items()}
    spread = max((max(v) - min(v)) / statistics.median(v) for v in times.values())
    return {
        "plain_ms": med["plain"] * 1e3,
        "concat_ms": med["concat"] * 1e3,
        "concat_over_plain": med["concat"] / med["plain"],
        "spread": spread,
    }


def setup_arg_parser() -> argparse.ArgumentParser:
    from bi_rl.bench import e2e

    p = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--workload", default="qwen3-1.7b", choices=sorted(e2e.WORKLOADS))
    p.add_argument("--model-dir", type=Path, default=None)
    p.add_argument("--models", default="bf16,4-bit", help=f"comma-separated: {e2e.MODELS_TEXT}")
    p.add_argument("--batches", default="1,8,64")
    p.add_argument("--modes", default="off,strict")
    p.add_argument("--steps", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--json", type=Path, default=None)
    return p


def main(argv=None) -> int:
    from bi_rl.bench import e2e

    args = setup_arg_parser().parse_args(argv)
    try:
        models = tuple(m for m in args.models.split(",") if m)
        e2e.check_models(models)
        batches = [int(b) for b in args.batches.split(",")]
        modes = [m for m in args.modes.split(",") if m]
        if any(m not in e2e.MODES for m in modes):
            raise ValueError(f"--modes takes {', '.join(e2e.MODES)}, got {args.modes!r}")
        if min(batches) < 1 or args.steps < 1 or args.repeats < 1:
            raise ValueError("--batches, --steps and --repeats must be >= 1")
    except ValueError as e:
        print(f"concat_ab: {e}", file=sys.stderr)
        return 2
    if CONCAT_ENV in os.environ:
        print(f"concat_ab: unset {CONCAT_ENV}: the plain side must run as it is", file=sys.stderr)
        return 2
    w = e2e.WORKLOADS[args.workload]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for label, model, _ in e2e.each_model(w, args.model_dir, tmp, models=models):
            for b in batches:
                prompts = e2e.make_prompts(b, w.prompt_lens, w.shape["vocab_size"], seed=b)
                for mode in modes:
                    row = {"model": label, "batch": b, "mode": mode}
                    row |= compare(model, prompts, mode)
                    row |= time_batch(model, prompts, mode, args.steps, args.repeats)
                    rows.append(row)
                    print(
                        f"{label:6} B={b:<3} {mode:6} plain {row['plain_ms']:7.2f} ms  concat "
                        f"{row['concat_ms']:7.2f} ms  concat/plain "
                        f"{row['concat_over_plain']:.3f}  spread {row['spread']:.2f}  logits "
                        f"differing {row['differ']} of {row['logits']} ({row['sets']} sets)",
                        flush=True,
                    )
    if args.json:
        args.json.write_text(json.dumps({"workload": w.name, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
