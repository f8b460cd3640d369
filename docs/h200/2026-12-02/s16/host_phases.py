# Host phases of the bare decode step of the 1.7B shape at B = 1 and 8, off and strict,
# alternating, 3 rounds, medians (ms): building the step's graph, queuing it (mx.async_eval),
# waiting for the device, the whole step; then mlx-lm's batch_generate's median step.
# ../s15/next/host_phases_q4.py with the model as an argument: argv[1] is the directory
# bi_rl.bench.e2e.write_models wrote, argv[2] the model in it (q4 or bf16).
import statistics
import sys
from pathlib import Path

import mlx.core as mx

from bi_rl.bench import e2e
from bi_rl.model import load_model

model, _ = load_model(Path(sys.argv[1]) / sys.argv[2])
for b in (1, 8):
    prompts = e2e.make_prompts(b, (150, 350), model.args.vocab_size, 0)
    rows = {}
    for _round in range(3):
        for mode in ("off", "strict"):
            rows.setdefault(mode, []).append(e2e.bare_step(model, prompts, mode, 64))
        _, steps = e2e.mlx_lm_rollout(model, prompts, 65)
        rows.setdefault("mlx-lm", []).append({"step": statistics.median(steps)})
    for mode, phs in rows.items():
        med = {k: 1e3 * statistics.median(p[k] for p in phs) for k in phs[0]}
        print(
            f"B={b:3d} {mode:6s} " + "  ".join(f"{k} {v:6.2f}" for k, v in med.items()), flush=True
        )
mx.synchronize()
