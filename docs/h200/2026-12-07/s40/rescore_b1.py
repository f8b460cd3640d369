"""Where strict rescoring of one sequence spends its time (the 1.7B shape in bf16, batch 1).

In the thirty-ninth session one 431-token sequence took 16-21 ms to rescore in strict mode
and 11-12 ms in off mode on an H100 (one repeat each, two runs), about 1.2 TFLOP of GEMMs, and
the block-shape rule, which shortens such GEMMs, left strict's rate within the runs' noise.
This prints, for each mode, the median wall time of `score` over ROUNDS calls, and a cProfile
of one strict call (top functions by their own time: the host's graph building and queuing
against its waits in mx.eval and the reads of the results).

    PYTHONPATH=. python3 rescore_b1.py MODEL_DIR [TOKENS]

MODEL_DIR: the bench's bf16 model directory (bi-bench --model-dir DIR writes DIR/bf16).
"""

import cProfile
import io
import pstats
import statistics
import sys
import time
from pathlib import Path

import mlx.core as mx

from bi_rl.bench.e2e import make_prompts, sets_built
from bi_rl.model import load_model
from bi_rl.score.scorer import Item, ScoreConfig, score

ROUNDS = 7


def main() -> None:
    model, _ = load_model(Path(sys.argv[1]))
    tokens = int(sys.argv[2]) if len(sys.argv) > 2 else 431
    vocab = model.args.vocab_size
    (p,) = make_prompts(1, (tokens - 256, tokens - 256), vocab, seed=1)
    done = mx.random.randint(3, vocab, (256,), key=mx.random.key(2)).tolist()
    items = [Item(p.tokens, tuple(done))]
    for mode in ("off", "strict"):
        with sets_built(model, mode):
            cfg = ScoreConfig(batch_size=1, mode=mode)
            score(model, items, cfg)  # warm-up: kernels compiled
            walls = []
            for _ in range(ROUNDS):
                mx.synchronize()
                t = time.perf_counter()
                score(model, items, cfg)
                walls.append(time.perf_counter() - t)
            print(f"{mode}: {1e3 * statistics.median(walls):.2f} ms a call (median of {ROUNDS})")
            if mode == "strict":
                prof = cProfile.Profile()
                prof.enable()
                score(model, items, cfg)
                prof.disable()
                out = io.StringIO()
                pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(25)
                print(out.getvalue())


if __name__ == "__main__":
    main()
