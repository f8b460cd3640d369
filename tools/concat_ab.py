"""Sibling projections fused into one stock-shaped GEMM a layer, timed against the model as
it is, in both modes, on bi-bench's end-to-end workload.

    PYTHONPATH=. python tools/fused_ab.py [--workload qwen3-1.7b] [--model-dir DIR] \
        [--models bf16,4-bit] [--batches 1,8,64] [--steps 64] [--repeats 3] [--json out.json]

A decode step of a Qwen3-shaped model runs seven projections a layer. q_proj, k_proj and
v_proj read the same activation, and so do gate_proj and up_proj, so each set can be one
product with the members' weights concatenated along the output (N) dimension, its output
split back into the members' columns. In `--mode off` each projection is a stock cuBLAS (or
stock quantized) call, and MLX's host time to queue a step grows with those calls; in
strict mode the invariant GEMM computes each output element from its row and column alone,
in an order fixed by K, so the fused product must give the members' bits exactly (the tool
checks it; with stock kernels in `--mode off` it reports how many logits differ instead).

For each model and batch the tool prefills the workload's prompts and times the bare decode
step (bi_rl.bench.e2e.bare_step: the model alone, its argmax fed back, step t + 1 queued
before step t is read) with the layers as they are and with the fused ones, alternating
the two within each repeat, per mode; it prints the median step of each and their ratio
(fused over plain; below 1 the fusion is faster). The fused layers hold their own
concatenated copy of the members' weights (the model's memory for those weights twice over
while they are installed), which is fine for a measurement and not how a rollout would do
it. The model is restored before the next side runs.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np

SETS = (("self_attn", ("q_proj", "k_proj", "v_proj")), ("mlp", ("gate_proj", "up_proj")))


class _Shared:
    """One fused product: the members' weights concatenated along N and the outputs of the
    last activation it was called with (each member takes its own columns once)."""

    def __init__(self, members: list[nn.Module]):
        first = members[0]
        self.quantized = type(first) is nn.QuantizedLinear
        if self.quantized:
            self.quant = (first.group_size, first.bits)
            self.w = mx.concatenate([m["weight"] for m in members])
            self.scales = mx.concatenate([m["scales"] for m in members])
            self.biases = mx.concatenate([m["biases"] for m in members])
            mx.eval(self.w, self.scales, self.biases)
        else:
            self.w = mx.concatenate([m["weight"] for m in members])
            mx.eval(self.w)
        widths = [m["weight"].shape[0] for m in members]
        self.cuts = list(np.cumsum(widths)[:-1])
        self.x, self.outputs = None, None

    def product(self, x):
        """Inside the mode the invariant ops, by the calls nn.Linear / nn.QuantizedLinear
        make there; outside it stock MLX's."""
        from bi_rl import _state, ops

        if self.quantized:
            g, bits = self.quant
            if _state.in_mode():
                return ops.quantized_matmul(x, self.w, self.scales, self.biases, True, g, bits)
            return mx.quantized_matmul(
                x, self.w, self.scales, self.biases, transpose=True, group_size=g, bits=bits
            )
        return ops.linear(x, self.w) if _state.in_mode() else x @ self.w.T

    def output(self, x, i: int):
        if self.x is not x:
            self.x, self.outputs = x, mx.split(self.product(x), self.cuts, axis=-1)
        return self.outputs[i]


class FusedPart(nn.Module):
    """A member of a fused set: its columns of the set's product."""

    def __init__(self, shared: _Shared, i: int):
        super().__init__()
        self._shared, self._i = shared, i

    def __call__(self, x):
        return self._shared.output(x, self._i)


def groupable(members: list) -> bool:
    """Members that one product can serve: all nn.Linear without bias, or all affine
    nn.QuantizedLinear without bias, of one input width, dtype and quantization."""
    kinds = {type(m) for m in members}
    if len(kinds) != 1 or kinds.pop() not in (nn.Linear, nn.QuantizedLinear):
        return False
    if any("bias" in m for m in members):
        return False
    first = members[0]
    if type(first) is nn.QuantizedLinear:
        same = {(m.group_size, m.bits, getattr(m, "mode", "affine")) for m in members}
        if len(same) != 1 or any("biases" not in m for m in members):
            return False
    return len({(m["weight"].shape[1], m["weight"].dtype) for m in members}) == 1


def fuse(model) -> list:
    """Replace every groupable set of every layer by FusedParts; the list to `unfuse` with."""
    undo = []
    for layer in model.layers:
        for block_name, names in SETS:
            block = getattr(layer, block_name, None)
            if block is None or not all(n in block for n in names):
                continue
            members = [block[n] for n in names]
            if not groupable(members):
                continue
            shared = _Shared(members)
            for i, n in enumerate(names):
                setattr(block, n, FusedPart(shared, i))
            undo.append((block, names, members))
    return undo


def unfuse(undo: list) -> None:
    for block, names, members in undo:
        for n, m in zip(names, members, strict=True):
            setattr(block, n, m)


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
    """Fused against plain logits of one decode step: how many of them differ in bits."""
    plain = first_logits(model, prompts, mode)
    undo = fuse(model)
    try:
        fused = first_logits(model, prompts, mode)
    finally:
        unfuse(undo)
    return {"logits": int(plain.size), "differ": int((plain != fused).sum()), "sets": len(undo)}


def time_batch(model, prompts, mode: str, steps: int, repeats: int) -> dict:
    """Median bare-step seconds, plain and fused, alternating which runs first."""
    from bi_rl.bench import e2e

    times = {"plain": [], "fused": []}
    for side in ("plain", "fused"):  # warm-up: kernels compiled, allocator sized
        undo = fuse(model) if side == "fused" else []
        try:
            e2e.bare_step(model, prompts, mode, 4)
        finally:
            unfuse(undo)
    for r in range(repeats):
        for side in ("plain", "fused") if r % 2 == 0 else ("fused", "plain"):
            undo = fuse(model) if side == "fused" else []
            try:
                times[side].append(e2e.bare_step(model, prompts, mode, steps)["step"])
            finally:
                unfuse(undo)
    med = {k: statistics.median(v) for k, v in times.items()}
    spread = max((max(v) - min(v)) / statistics.median(v) for v in times.values())
    return {
        "plain_ms": med["plain"] * 1e3,
        "fused_ms": med["fused"] * 1e3,
        "fused_over_plain": med["fused"] / med["plain"],
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
        print(f"fused_ab: {e}", file=sys.stderr)
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
                        f"{label:6} B={b:<3} {mode:6} plain {row['plain_ms']:7.2f} ms  fused "
                        f"{row['fused_ms']:7.2f} ms  fused/plain {row['fused_over_plain']:.3f}  "
                        f"spread {row['spread']:.2f}  logits differing {row['differ']} of "
                        f"{row['logits']} ({row['sets']} sets fused)",
                        flush=True,
                    )
    if args.json:
        args.json.write_text(json.dumps({"workload": w.name, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
