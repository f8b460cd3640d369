"""The scorer with and without pipelined batches, alternating in one process, same bits.

    git show 02d83cb:bi_rl/score/scorer.py > bi_rl/score/_scorer_old.py
    PYTHONPATH=. python score_pipeline_ab.py MODEL_DIR SAMPLES BATCH [PROMPT_MIN,PROMPT_MAX]

MODEL_DIR: a bi-bench model directory (its tiny or 1.7B workload's bf16 model). SAMPLES random
prompts (20-60 tokens unless given) with 24 completion tokens each are rescored BATCH at a
time in off and strict mode, old (one batch after another) and new (pipelined) alternating,
seven rounds; the first round is dropped, the median of the others printed with a digest of
every logprob and fingerprint (old and new must agree)."""

import hashlib
import statistics
import sys
import time
from pathlib import Path

import mlx.core as mx

from bi_rl.bench.e2e import make_prompts, sets_built
from bi_rl.model import load_model
from bi_rl.score import _scorer_old as old
from bi_rl.score import scorer as new

model, _ = load_model(Path(sys.argv[1]))
n, bs = int(sys.argv[2]), int(sys.argv[3])
lo, hi = (int(v) for v in (sys.argv[4] if len(sys.argv) > 4 else "20,60").split(","))
vocab = model.args.vocab_size
prompts = make_prompts(n, (lo, hi), vocab, seed=3)
done = mx.random.randint(3, vocab, (n, 24), key=mx.random.key(4)).tolist()
for mode in ("off", "strict"):
    with sets_built(model, mode):
        times, digest = {"old": [], "new": []}, {}
        for _ in range(7):
            for name, m in (("old", old), ("new", new)):
                items = [m.Item(p.tokens, tuple(d)) for p, d in zip(prompts, done, strict=True)]
                cfg = m.ScoreConfig(batch_size=bs, mode=mode)
                start = time.perf_counter()
                out = m.score(model, items, cfg)
                times[name].append(time.perf_counter() - start)
                blob = b"".join(
                    o.logprob_bits.tobytes() + str(o.fingerprints).encode() for o in out
                )
                digest[name] = hashlib.sha1(blob).hexdigest()[:12]
        med = {k: statistics.median(v[1:]) for k, v in times.items()}
        print(
            f"{mode} samples={n} batch={bs}: old {1e3 * med['old']:.1f} ms, new"
            f" {1e3 * med['new']:.1f} ms, new/old {med['new'] / med['old']:.3f};"
            f" digests {digest['old']} {digest['new']}"
        )
