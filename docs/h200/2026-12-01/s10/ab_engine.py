# The engine's per-step head on the host, before and after this session's change, in one
# process on the 1.7B shape (bf16): each variant decodes the same prefilled batch for 64
# steps, step t + 1 queued before step t is read, alternating, 3 rounds, medians (ms a step).
#   bare: the model and argmax (bi-bench's bare step)
#   old:  the engine's step as before: the mode entered and left every step with the
#         wrappers installed and restored each time, sample() and token_logprobs() each
#         scaling the logits, the fingerprint, NumPy reads of the logprob and fingerprint bits
#   new:  the engine's step now: the wrappers held for the run (mode.held), one scaled-logits
#         array shared by the sampler and the logprobs, reads through the buffers
# Keys for the sampler are made every step in both (row_keys), as the engine does.
import statistics
import sys
import time
from contextlib import nullcontext
from pathlib import Path

import mlx.core as mx
import numpy as np

from bi_rl.bench import e2e
from bi_rl.logprobs import (
    fingerprint_ints,
    row_fingerprints,
    scaled_logits,
    scaled_token_logprobs,
    token_logprobs,
)
from bi_rl.mode import held, named_mode
from bi_rl.model import load_model
from bi_rl.rollout.engine import _read_bits
from bi_rl.rollout.sampler import SamplerConfig, row_keys, sample, sample_scaled, sequence_id

STEPS = 64
VARIANTS = sys.argv[2].split(",") if len(sys.argv) > 2 else ["bare", "old", "new"]


def run(model, prompts, mode, variant):
    batch = e2e.prefilled(model, prompts, mode)
    cfg = SamplerConfig(temperature=1.0, seed=0)
    ids = [sequence_id(p.id, 0) for p in prompts]
    y, pending = batch.y, None
    use_held = variant in ("new", "held") and mode != "off"
    shared = variant in ("new", "shared")
    buffers = variant in ("new", "read")
    outer = named_mode(mode) if variant == "bare" else (held() if use_held else nullcontext())
    with outer:
        for i in range(STEPS + 2):
            if i == 2:
                mx.eval(y)
                start = time.perf_counter()
            if variant == "bare":
                logits = model(y[:, None], cache=batch.caches)[:, -1, :]
                nxt = mx.argmax(logits, axis=-1).astype(mx.int32)
                outs = (nxt,)
            else:
                keys = row_keys(0, [(s, i) for s in ids])
                with named_mode(mode):
                    logits = model(y[:, None], cache=batch.caches)[:, -1, :]
                    if not shared:
                        nxt = sample(logits, keys, cfg)
                        lp = token_logprobs(logits, nxt, cfg.temperature)
                    else:
                        x = scaled_logits(logits, cfg.temperature)
                        nxt = sample_scaled(x, keys, cfg)
                        lp = scaled_token_logprobs(x, nxt)
                    outs = (nxt, lp, row_fingerprints(logits))
            mx.async_eval(*outs)
            if pending is not None:
                pending[0].tolist()
                if variant == "bare":
                    pass
                elif not buffers:
                    np.array(pending[1]).view(np.uint32).tolist()
                    fingerprint_ints(np.array(pending[2]))
                else:
                    _read_bits(pending[1], pending[2])
            pending, y = outs, nxt
        pending[0].tolist()
    return 1e3 * (time.perf_counter() - start) / STEPS


model, _ = load_model(Path(sys.argv[1]) / "bf16")

# Does reading an evaluated array block on work queued after it? Time each read of a small
# evaluated array while a decode step of the model is in flight (ms, 5 tries each).
probe = e2e.prefilled(model, e2e.make_prompts(8, (150, 350), model.args.vocab_size, 0), "off")
small = mx.array(np.arange(16, dtype=np.float32))
mx.eval(small)
for name, read in (
    ("numpy", lambda a: np.array(a).view(np.uint32).tolist()),
    ("buffer", lambda a: memoryview(a).cast("B").cast("I").tolist()),
    ("tolist", lambda a: a.tolist()),
):
    spent = []
    for _ in range(5):
        out = model(probe.y[:, None], cache=probe.caches)[:, -1, :]
        mx.async_eval(out)
        t = time.perf_counter()
        read(small)
        spent.append(1e3 * (time.perf_counter() - t))
        t = time.perf_counter()
        mx.eval(out)
        spent.append(1e3 * (time.perf_counter() - t))
    print(
        f"read while a step is queued, {name}: read "
        + " ".join(f"{x:.3f}" for x in spent[0::2])
        + " ms; then the step's wait "
        + " ".join(f"{x:.3f}" for x in spent[1::2]),
        flush=True,
    )
for b in (1, 8):
    prompts = e2e.make_prompts(b, (150, 350), model.args.vocab_size, 0)
    for mode in ("off", "strict"):
        times = {v: [] for v in VARIANTS}
        for v in times:  # warm-up
            run(model, prompts, mode, v)
        for _ in range(3):
            for v in times:
                times[v].append(run(model, prompts, mode, v))
        med = {v: statistics.median(t) for v, t in times.items()}
        print(
            f"B={b:2d} {mode:6s} "
            + "  ".join(f"{v} {m:6.2f} ({m / med['old']:.3f})" for v, m in med.items())
            + "  spread "
            + f"{max((max(t) - min(t)) / statistics.median(t) for t in times.values()):.2f}",
            flush=True,
        )
mx.synchronize()
