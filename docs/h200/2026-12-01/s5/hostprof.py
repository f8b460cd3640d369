# cProfile of the host side of 20 strict decode steps (model + the engine's post-processing),
# B = 64.
import cProfile
import io
import os
import pstats
import sys
from pathlib import Path

import mlx.core as mx

from bi_rl.bench import e2e
from bi_rl.logprobs import row_fingerprints, token_logprobs
from bi_rl.mode import named_mode
from bi_rl.model import load_model
from bi_rl.rollout.sampler import SamplerConfig, row_keys, sample

w = e2e.WORKLOADS[os.environ.get("WL", "qwen3-1.7b")]
model, _ = load_model(e2e.write_models(w, Path(os.environ.get("MD", "/tmp/q17")))["bf16"])
prompts = e2e.make_prompts(64, w.prompt_lens, w.shape["vocab_size"], seed=64)
cfg = SamplerConfig(temperature=1.0, seed=0)
for mode in sys.argv[1:] or ["strict"]:
    batch = e2e.prefilled(model, prompts, mode)
    y = batch.y

    def step(y, i, batch=batch):
        keys = row_keys(0, [(j, i) for j in range(64)])
        logits = model(y[:, None], cache=batch.caches)[:, -1, :]
        nxt = sample(logits, keys, cfg)
        outs = (nxt, token_logprobs(logits, nxt, 1.0), row_fingerprints(logits))
        mx.async_eval(*outs)
        mx.eval(*outs)
        return nxt

    with named_mode(mode):
        for i in range(5):
            y = step(y, i)
        pr = cProfile.Profile()
        pr.enable()
        for i in range(5, 25):
            y = step(y, i)
        pr.disable()
    s = io.StringIO()
    st = pstats.Stats(pr, stream=s)
    st.sort_stats("tottime").print_stats(35)
    st.sort_stats("cumulative").print_stats(45)
    print(f"===== {mode}: 20 steps\n" + s.getvalue())
