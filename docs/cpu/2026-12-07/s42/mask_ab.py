"""The bare decode step with the mask dropped where no row is padded, and always built.

    PYTHONPATH=. python mask_ab.py MODEL_DIR BATCH [STEPS] [MODES]

MODEL_DIR: a bi-bench model directory (e.g. the 1.7B workload's bf16 model). BATCH prompts
of one length (so no row is padded) are prefilled and decoded STEPS steps (64 unless given)
in each of MODES (comma-separated, "off,strict" unless given) with
bi_rl.rollout.caches.EngineBatchKVCache dropping the mask ("dropped") and with every cache
kept marked padded ("masked", mlx-lm's behaviour), alternating, seven rounds; the first is
dropped, the medians printed with their ratio. A left-padded batch (lengths 150-350) is timed
the same way as a control: there both arms build the mask (at B = 1 it is one row, unpadded
too)."""

import statistics
import sys
from pathlib import Path

from bi_rl.bench import e2e
from bi_rl.model import load_model
from bi_rl.rollout import batch as batch_mod

model, _ = load_model(Path(sys.argv[1]))
b = int(sys.argv[2])
steps = int(sys.argv[3]) if len(sys.argv) > 3 else 64
modes = (sys.argv[4] if len(sys.argv) > 4 else "off,strict").split(",")
vocab = model.args.vocab_size
mark = batch_mod._mark
for mode, lens in [(m, n) for m in modes for n in ((256, 256), (150, 350))]:
    prompts = e2e.make_prompts(b, lens, vocab, seed=5)
    times = {"dropped": [], "masked": []}
    for _ in range(7):
        for name in times:
            batch_mod._mark = mark if name == "dropped" else (lambda caches, pad: None)
            times[name].append(e2e.bare_step(model, prompts, mode, steps)["step"])
    batch_mod._mark = mark
    med = {k: statistics.median(v[1:]) for k, v in times.items()}
    print(
        f"{mode} B={b} prompt lengths {lens}: dropped {1e3 * med['dropped']:.3f} ms,"
        f" masked {1e3 * med['masked']:.3f} ms a step, dropped/masked"
        f" {med['dropped'] / med['masked']:.3f}"
    )
