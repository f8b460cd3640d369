# CUDA graph nodes MLX records for one decode step (B given), strict or off: run under
# MLX_SAVE_CUDA_GRAPHS_DOT_FILE=/tmp/dots/<mode>/g (read once per process), count what one
# synchronised step writes.
import glob
import os
import re
import sys
from pathlib import Path

import mlx.core as mx

from bi_rl.bench import e2e
from bi_rl.mode import named_mode
from bi_rl.model import load_model

mode, b = sys.argv[1], int(sys.argv[2])
pattern = os.environ["MLX_SAVE_CUDA_GRAPHS_DOT_FILE"] + "_*.dot"
w = e2e.WORKLOADS["qwen3-1.7b"]
model, _ = load_model(e2e.write_models(w, Path("/tmp/q17"))["bf16"])
prompts = e2e.make_prompts(b, w.prompt_lens, w.shape["vocab_size"], seed=b)
batch = e2e.prefilled(model, prompts, mode)
y = batch.y
with named_mode(mode):
    for i in range(4):
        mx.eval(y)
        mx.synchronize()
        before = set(glob.glob(pattern))
        logits = model(y[:, None], cache=batch.caches)[:, -1, :]
        y = mx.argmax(logits, axis=-1).astype(mx.int32)
        mx.eval(y)
        mx.synchronize()
        new = sorted(set(glob.glob(pattern)) - before)
        nodes = kernels = 0
        for f in new:
            with open(f) as lines:
                for line in lines:
                    if "->" in line or "[" not in line:
                        continue
                    nodes += 1
                    kernels += bool(re.search(r"KERNEL|kernel", line))
        print(
            f"{mode} B={b} step {i}: {len(new)} graphs committed, {nodes} nodes, "
            f"{kernels} kernel-like",
            flush=True,
        )
