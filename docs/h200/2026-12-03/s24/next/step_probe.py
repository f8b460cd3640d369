"""Host time to build one decode step's graph of the Qwen3-1.7B-shaped model (28 layers,
random weights, bf16 and 4-bit), at batch 1 and 8, in strict mode (projections grouped, as a
rollout runs them) and off, with the real kernels: the host's share of a step that is
host-bound at batch 1, where per-call costs add up over about 150 kernel calls a step.

Per cell: the median over 15 samples of one step's graph built (nothing evaluated) over a
cache of 256 positions, the cache put back after each; then the step built and evaluated,
for scale. One JSON line a cell; run once per arm (PYTHONPATH picks it):

    PYTHONPATH=<tree> python3 -P docs/h200/2026-12-03/s24/next/step_probe.py LABEL >> step.jsonl
"""

from __future__ import annotations

import statistics
import sys
import time

import mlx.core as mx
import mlx.nn as nn
import orjson
from mlx_lm.models.cache import make_prompt_cache

from bi_rl.bench import e2e
from bi_rl.fusion import grouping
from bi_rl.mode import named_mode

CONTEXT = 256


def model_of(bits: int | None):
    w = e2e.WORKLOADS["qwen3-1.7b"]
    module = e2e.models_module(w.model_type)
    model = module.Model(module.ModelArgs.from_dict(e2e.model_config(w)))
    model.set_dtype(mx.bfloat16)
    if bits:
        nn.quantize(model, group_size=64, bits=bits)
    mx.eval(model.parameters())
    return model


def step_times(model, batch: int, mode: str) -> tuple[float, float]:
    """(median seconds to build one step's graph, median seconds to build and evaluate it)."""
    cache = make_prompt_cache(model)
    prompt = mx.zeros((batch, CONTEXT), mx.int32)
    token = mx.zeros((batch, 1), mx.int32)
    with named_mode(mode), grouping(model, mode == "strict"):
        mx.eval(model(prompt, cache=cache))
        mx.eval([c.state for c in cache])
        saved = [(c.offset, c.keys, c.values) for c in cache]

        def restore():
            for c, (offset, keys, values) in zip(cache, saved, strict=True):
                c.offset, c.keys, c.values = offset, keys, values

        def one(evaluate: bool) -> float:
            start = time.perf_counter()
            out = model(token, cache=cache)
            if evaluate:
                mx.eval(out)
                mx.synchronize()
            took = time.perf_counter() - start
            restore()
            return took

        for _ in range(3):
            one(True)
        build = statistics.median(one(False) for _ in range(15))
        total = statistics.median(one(True) for _ in range(15))
    return build, total


def main() -> None:
    label = sys.argv[1]
    for name, bits in (("bf16", None), ("4-bit", 4)):
        model = model_of(bits)
        for batch in (1, 8):
            for mode in ("strict", "off"):
                build, total = step_times(model, batch, mode)
                row = {
                    "arm": label,
                    "model": name,
                    "batch": batch,
                    "mode": mode,
                    "build_ms": round(build * 1e3, 3),
                    "step_ms": round(total * 1e3, 3),
                }
                print(orjson.dumps(row).decode(), flush=True)
        del model
        mx.clear_cache()


if __name__ == "__main__":
    main()
