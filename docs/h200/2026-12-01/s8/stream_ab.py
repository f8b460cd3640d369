# Does the stream a decode step runs on change its host time? The model alone at B = 8 and 64
# (mode off, then strict), on the default stream and inside `with mx.stream(s)` for a stream
# made with mx.new_stream (mlx-lm's generator runs on one), alternating, 3 rounds; then
# mlx-lm's batch_generate for reference. Prints ms a step and the host phases.
import statistics
import sys
from pathlib import Path

import mlx.core as mx

from bi_rl.bench import e2e
from bi_rl.model import load_model

model, _ = load_model(Path(sys.argv[1]) / "bf16")
s = mx.new_stream(mx.default_device())
for b in (8, 64):
    prompts = e2e.make_prompts(b, (150, 350), model.args.vocab_size, 0)
    rows = {}
    for _round in range(3):
        for mode in ("off", "strict"):
            for where in ("default", "new"):
                if where == "new":
                    with mx.stream(s):
                        ph = e2e.bare_step(model, prompts, mode, 64)
                else:
                    ph = e2e.bare_step(model, prompts, mode, 64)
                rows.setdefault((mode, where), []).append(ph)
        t = e2e._timed(lambda p=prompts: e2e.mlx_lm_rollout(model, p, 65))
        t1 = e2e._timed(lambda p=prompts: e2e.mlx_lm_rollout(model, p, 1))
        rows.setdefault(("mlx-lm", "its own"), []).append({"step": (t - t1) / 64})
    for (mode, where), phs in rows.items():
        med = {k: 1e3 * statistics.median(p[k] for p in phs) for k in phs[0]}
        print(
            f"B={b:3d} {mode:6s} {where:8s} " + "  ".join(f"{k} {v:6.2f}" for k, v in med.items()),
            flush=True,
        )
