# Host time of building one decode step's graph (the bare step's `build` phase) of a
# Qwen3-1.7B-shaped model cut to LAYERS layers, stock against the mode, on the CPU: the prompts
# are prefilled for real by stock MLX on the CPU, then each step is built with the CUDA backend
# whose kernels are stand-ins (zeros of the output's shape), and the caches' arrays are put
# back after each build so every build sees the same cache. argv: bits (4 or 16), batch, and
# anything third to print a cProfile of the strict builds. Run from the repository root:
#     python docs/cpu/2026-12-02/step_build.py 4 1
import copy
import cProfile
import pstats
import sys
import time

import mlx.core as mx
import mlx.nn as nn

from bi_rl import backends
from bi_rl.backends import cuda
from bi_rl.backends.cuda import attention, hopper, hopper_attention, hopper_qmm
from bi_rl.bench import e2e
from bi_rl.fusion import grouping
from bi_rl.mode import named_mode


def stand_in(**kw):
    return [mx.zeros(s, d) for s, d in zip(kw["output_shapes"], kw["output_dtypes"], strict=True)]


for mod in (hopper, hopper_qmm, attention, hopper_attention):
    mod.kernel = lambda spec: stand_in
hopper.prepare = hopper_qmm.prepare = hopper_attention.prepare = lambda *a: True
hopper.prepare_group = hopper_qmm.prepare_group = lambda *a: True
hopper.available = lambda: True

LAYERS = 4
bits, b = int(sys.argv[1]), int(sys.argv[2])
prof = len(sys.argv) > 3
w = e2e.WORKLOADS["qwen3-1.7b"]
module = e2e.models_module(w.model_type)
cfg = e2e.model_config(w) | {"num_hidden_layers": LAYERS}
model = module.Model(module.ModelArgs.from_dict(cfg))
model.set_dtype(mx.bfloat16)
if bits == 4:
    nn.quantize(model, group_size=64, bits=4)
mx.eval(model.parameters())
prompts = e2e.make_prompts(b, (20, 40), w.shape["vocab_size"], 0)
batch = e2e.prefilled(model, prompts, "off")
mx.eval(batch.y, [c.state for c in batch.caches])
y = batch.y
stock_attention = mx.fast.scaled_dot_product_attention


def build(mode):
    saved = [copy.copy(c.__dict__) for c in batch.caches]
    logits = model(y[:, None], cache=batch.caches)[:, -1, :]
    mx.argmax(logits, axis=-1).astype(mx.int32)
    for c, s in zip(batch.caches, saved, strict=True):
        c.__dict__.update(s)


def per_build_us(mode, n=200):
    with named_mode(mode):
        build(mode)
        best = float("inf")
        for _ in range(5):
            t = time.perf_counter()
            for _ in range(n):
                build(mode)
            best = min(best, (time.perf_counter() - t) / n)
    return best * 1e6


res = {}
with backends.use(cuda.BACKEND), grouping(model, True):
    for _ in range(3):
        mx.fast.scaled_dot_product_attention = lambda q, *a, **k: mx.zeros(q.shape, q.dtype)
        res.setdefault("off", []).append(per_build_us("off"))
        mx.fast.scaled_dot_product_attention = stock_attention
        res.setdefault("strict", []).append(per_build_us("strict"))
    for k, v in res.items():
        print(f"bits {bits} B={b} {k:6s} build {min(v):8.1f} us ({min(v) / LAYERS:6.1f} a layer)")
    if prof:
        with named_mode("strict"):
            pr = cProfile.Profile()
            pr.enable()
            for _ in range(300):
                build("strict")
            pr.disable()
        pstats.Stats(pr).sort_stats("tottime").print_stats(30)
