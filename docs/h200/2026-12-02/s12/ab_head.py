# Rescoring with the output head on the read rows alone (ROW_HEAD_FAMILIES) against every
# position's logits, on the workload's model at batch sizes 1, 8 and 16 with the e2e prompts
# and 256 random completion tokens each: seconds of score() per arm and mode (median of
# REPEATS alternating rounds after a warm-up), and the two arms' logprob bits and
# fingerprints compared.
import statistics
import sys
import time

import mlx.core as mx
import numpy as np

import bi_rl.score.scorer as S
from bi_rl.bench.e2e import WORKLOADS, make_prompts
from bi_rl.model import load_model
from bi_rl.score.scorer import Item, ScoreConfig, score

REPEATS = 5
w = WORKLOADS["qwen3-1.7b"]
model, _ = load_model(sys.argv[1])
listed = S.ROW_HEAD_FAMILIES
rng = np.random.default_rng(0)
for b in (1, 8, 16):
    prompts = make_prompts(b, w.prompt_lens, model.args.vocab_size, seed=b)
    items = [
        Item(p.tokens, tuple(int(t) for t in rng.integers(4, model.args.vocab_size, 256)))
        for p in prompts
    ]
    ptok = sum(len(p.tokens) for p in prompts)
    arms = {"rows": listed, "all": frozenset()}
    times = {(a, m): [] for a in arms for m in ("strict", "off")}
    bits = {}
    for r in range(REPEATS + 1):
        for m in ("strict", "off"):
            for a, fam in arms.items():
                S.ROW_HEAD_FAMILIES = fam
                mx.synchronize()
                t = time.perf_counter()
                out = score(model, items, ScoreConfig(batch_size=b, mode=m))
                dt = time.perf_counter() - t
                if r:
                    times[(a, m)].append(dt)
                if r == 1:
                    bits[(a, m)] = (
                        np.concatenate([o.logprob_bits for o in out]),
                        [f for o in out for f in o.fingerprints],
                    )
    S.ROW_HEAD_FAMILIES = listed
    for m in ("strict", "off"):
        tr, ta = (statistics.median(times[(a, m)]) for a in arms)
        spread = max(
            (max(v) - min(v)) / statistics.median(v) for k, v in times.items() if k[1] == m
        )
        same = np.array_equal(bits[("rows", m)][0], bits[("all", m)][0])
        fps = bits[("rows", m)][1] == bits[("all", m)][1]
        ndiff = int((bits[("rows", m)][0] != bits[("all", m)][0]).sum())
        print(
            f"B={b:2d} {m:6s} prompt {ptok:5d} + {256 * b:5d} completion tokens: "
            f"rows {tr * 1e3:8.2f} ms, "
            f"all {ta * 1e3:8.2f} ms, rows/all {tr / ta:.3f}, spread {spread:.2f}; "
            f"logprob bits equal {same} ({ndiff} differ), fingerprints equal {fps}",
            flush=True,
        )
