"""Whether queuing a forward pass's layers as they are built shortens one batch's rescoring.

A scoring call builds the whole model's graph on the host and only then evaluates it, so with
one batch the host's building and the device's work add up (in the mode a 4-bit decoder layer's
decode call costs the host about twice stock's: tools/host_cost.py, BENCHMARK.md). Wrapping
each decoder layer so that every EVERY-th one's output is queued (mx.async_eval) as soon as it
is built lets the device start on the first layers while the host builds the rest; it changes
no operation, so the bits must be the same (checked here by digest). Timed per mode: the plain
model and EVERY = 1 and 4, alternating, at B = 1 (one 431-token sequence, 256 scored) and B =
8, medians of 9 calls after a warm-up.

    PYTHONPATH=. python3 eager_layers_ab.py MODEL_DIR

MODEL_DIR: the bench's bf16 model directory (bi-bench --model-dir DIR writes DIR/bf16).
"""

import hashlib
import statistics
import sys
import time
from pathlib import Path

import mlx.core as mx

from bi_rl.bench.e2e import make_prompts, sets_built
from bi_rl.model import load_model
from bi_rl.score.scorer import Item, ScoreConfig, score


class Queued:
    """A decoder layer whose output is queued for evaluation when `on`."""

    def __init__(self, layer, on: bool):
        self.layer, self.on = layer, on

    def __call__(self, *args, **kwargs):
        out = self.layer(*args, **kwargs)
        if self.on:
            mx.async_eval(out)
        return out

    def __getattr__(self, name):
        return getattr(self.layer, name)


def main() -> None:
    model, _ = load_model(Path(sys.argv[1]))
    body = model["model"]
    layers = list(body.layers)
    vocab = model.args.vocab_size
    arms = {"plain": layers}
    for every in (1, 4):
        arms[f"every{every}"] = [Queued(x, i % every == every - 1) for i, x in enumerate(layers)]
    for b in (1, 8):
        prompts = make_prompts(b, (175, 175) if b == 1 else (150, 350), vocab, seed=b)
        done = mx.random.randint(3, vocab, (b, 256), key=mx.random.key(2)).tolist()
        items = [Item(p.tokens, tuple(d)) for p, d in zip(prompts, done, strict=True)]
        for mode in ("off", "strict"):
            cfg = ScoreConfig(batch_size=b, mode=mode)
            times, digests = {a: [] for a in arms}, {}
            with sets_built(model, mode):
                for stack in arms.values():  # warm-up
                    body.layers = stack
                    score(model, items, cfg)
                for _ in range(9):
                    for arm, stack in arms.items():
                        body.layers = stack
                        mx.synchronize()
                        start = time.perf_counter()
                        out = score(model, items, cfg)
                        times[arm].append(time.perf_counter() - start)
                        blob = b"".join(o.logprob_bits.tobytes() for o in out)
                        digests[arm] = hashlib.sha1(blob).hexdigest()[:12]
            body.layers = layers
            med = {a: statistics.median(v) for a, v in times.items()}
            print(
                f"B={b} {mode}: "
                + ", ".join(
                    f"{a} {1e3 * t:.2f} ms ({t / med['plain']:.3f})" for a, t in med.items()
                )
                + f"; same bits: {len(set(digests.values())) == 1}"
            )


if __name__ == "__main__":
    main()
