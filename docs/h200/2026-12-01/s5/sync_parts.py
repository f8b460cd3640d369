# Per decode step, synchronised: host build, submit with an idle GPU, then the wait for the device.
import statistics
import sys
import time
from pathlib import Path

import mlx.core as mx

from bi_rl.bench import e2e
from bi_rl.mode import named_mode
from bi_rl.model import load_model

w = e2e.WORKLOADS["qwen3-1.7b"]
model, _ = load_model(e2e.write_models(w, Path("/tmp/q17"))["bf16"])
for b in [int(x) for x in sys.argv[1:]] or (64, 8):
    prompts = e2e.make_prompts(b, w.prompt_lens, w.shape["vocab_size"], seed=b)
    for mode in ("strict", "off"):
        batch = e2e.prefilled(model, prompts, mode)
        y = batch.y
        rows = []
        with named_mode(mode):
            for i in range(40):
                mx.eval(y)
                mx.synchronize()
                t0 = time.perf_counter()
                logits = model(y[:, None], cache=batch.caches)[:, -1, :]
                nxt = mx.argmax(logits, axis=-1).astype(mx.int32)
                t1 = time.perf_counter()
                mx.async_eval(nxt)
                t2 = time.perf_counter()
                mx.eval(nxt)
                mx.synchronize()
                t3 = time.perf_counter()
                y = nxt
                if i >= 8:
                    rows.append((t1 - t0, t2 - t1, t3 - t2))
        med = [1e3 * statistics.median(r[k] for r in rows) for k in range(3)]
        print(
            f"B={b:3} {mode:7} build {med[0]:7.3f}  submit(idle GPU) {med[1]:7.3f}  "
            f"then wait {med[2]:7.3f}  total {sum(med):7.3f} ms",
            flush=True,
        )
