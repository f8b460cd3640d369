"""The bare decode step of the 1.7B shape in 4-bit (strict) with sibling quantized projections
grouped (bi_rl.fusion: q/k/v and gate/up in one launch each) and without, alternating, 4
rounds (the first warms up), medians, ms a step: the graph build, the queuing
(mx.async_eval), the wait and the whole step; then the bits of one step's logits both ways
(they must be equal). The model is built in memory with bi-bench's random weights."""

import statistics

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx.utils import tree_flatten, tree_unflatten

from bi_rl.bench import e2e
from bi_rl.fusion import group_projections, ungroup_projections
from bi_rl.mode import named_mode

w = e2e.WORKLOADS["qwen3-1.7b"]
module = e2e.models_module(w.model_type)
config = {"model_type": w.model_type, "rms_norm_eps": 1e-6, "rope_theta": 1e6, **w.shape}
config["max_position_embeddings"] = 40960
model = module.Model(module.ModelArgs.from_dict(config))
params = []
for i, (name, p) in enumerate(tree_flatten(model.parameters())):
    if "norm" in name:
        params.append((name, mx.ones(p.shape, dtype=mx.bfloat16)))
    else:
        r = mx.random.normal(p.shape, key=mx.random.key(i)) * 0.02
        params.append((name, r.astype(mx.bfloat16)))
model.update(tree_unflatten(params))
nn.quantize(model, group_size=64, bits=4)
mx.eval(model.parameters())
for b in (1, 8):
    prompts = e2e.make_prompts(b, w.prompt_lens, model.args.vocab_size, 0)
    logits = {}
    for grouped in (False, True):
        (group_projections if grouped else ungroup_projections)(model)
        batch = e2e.prefilled(model, prompts, "strict")
        with named_mode("strict"):
            out = model(batch.y[:, None], cache=batch.caches)[:, -1, :]
        logits[grouped] = np.array(out.astype(mx.float32)).view(np.uint32)
    same = bool((logits[False] == logits[True]).all())
    rows = {False: [], True: []}
    for _ in range(4):
        for grouped in (False, True):
            rows[grouped].append(e2e.bare_step(model, prompts, "strict", 64, group=grouped))
    for grouped, phases in rows.items():
        med = {k: 1e3 * statistics.median(p[k] for p in phases[1:]) for k in phases[0]}
        name = "grouped" if grouped else "separate"
        print(
            f"4-bit B={b:2d} {name:8s} "
            + "  ".join(f"{k} {v:6.2f}" for k, v in med.items())
            + f"  logits equal: {same}",
            flush=True,
        )
