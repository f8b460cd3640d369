# The bare decode step of the 1.7B shape (bf16, strict) with sibling projections grouped
# (bi_rl.fusion: q/k/v and gate/up in one launch each) and without, alternating, 3 rounds,
# medians, ms a step: the graph build, the queuing (mx.async_eval), the wait and the whole
# step; then the bits of one step's logits both ways (they must be equal).
import statistics
import sys
from pathlib import Path

import mlx.core as mx
import numpy as np

from bi_rl.bench import e2e
from bi_rl.fusion import group_projections, ungroup_projections
from bi_rl.mode import named_mode
from bi_rl.model import load_model

model, _ = load_model(Path(sys.argv[1]) / "bf16")
for b in (1, 8):
    prompts = e2e.make_prompts(b, (150, 350), model.args.vocab_size, 0)
    logits = {}
    for grouped in (False, True):
        (group_projections if grouped else ungroup_projections)(model)
        batch = e2e.prefilled(model, prompts, "strict")
        with named_mode("strict"):
            out = model(batch.y[:, None], cache=batch.caches)[:, -1, :]
        logits[grouped] = np.array(out.astype(mx.float32)).view(np.uint32)
    same = bool((logits[False] == logits[True]).all())
    rows = {False: [], True: []}
    for _ in range(4):  # the first round warms up
        for grouped in (False, True):
            (group_projections if grouped else ungroup_projections)(model)
            rows[grouped].append(e2e.bare_step(model, prompts, "strict", 64))
    for grouped, phases in rows.items():
        med = {k: 1e3 * statistics.median(p[k] for p in phases[1:]) for k in phases[0]}
        name = "grouped" if grouped else "separate"
        print(
            f"B={b:2d} {name:8s} "
            + "  ".join(f"{k} {v:6.2f}" for k, v in med.items())
            + f"  logits equal: {same}",
            flush=True,
        )
ungroup_projections(model)
