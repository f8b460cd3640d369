"""Host (Python) time per call of the invariant path's dispatch, on any machine.

    python tools/host_cost.py

Measures, per call, with MLX arrays but no kernel run (a stand-in returns an output of the
right shape where `mx.fast.cuda_kernel` would launch): the CUDA backend's Hopper GEMM
dispatch (`hopper.gemm`, the backend's `linear`, `bi_rl.ops.linear` through the backend
table), beside building stock MLX's `x @ w.T` node and the stand-in alone; the same for a
4-bit quantized projection (the backend's `quantized_matmul`, `bi_rl.ops`, an
`nn.QuantizedLinear` called inside the mode, stock's node), a layer's three quantized q/k/v
projections grouped into one launch (bi_rl.fusion) and not, and as one product over their
concatenated weights (bi_rl.concat) stock and in the mode, a whole 4-bit decoder layer's
decode call stock and in the mode (its attention kernel a stand-in too), each also with its
sibling projections concatenated (bi_rl.concat); and the graph the rollout engine builds
after each decode step (keyed sampling, logprobs, row fingerprints over a 151936-token
vocabulary) beside a bare argmax. A decode step of a 28-layer model makes about
200 GEMM calls, so microseconds here are milliseconds a step at batch 1, where the step's
GPU time is a few milliseconds.
"""

from __future__ import annotations

import argparse
import time
from contextlib import nullcontext
from unittest.mock import patch

import mlx.core as mx
import mlx.nn as nn


def per_call_us(fn, n: int = 3000, repeats: int = 7) -> float:
    """The fastest of `repeats` timings of n calls, per call: host time on a shared machine
    only ever gains noise, so the minimum is the estimate."""
    fn()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(n):
            fn()
        best = min(best, time.perf_counter() - start)
    return best / n * 1e6


def _layer_us(cuda, stand_in, mode: bool, concat: bool = False) -> float:
    """Host time of one 4-bit Qwen3-1.7B-shaped decoder layer's decode call, every CUDA kernel
    a stand-in (attention's too, and stock's `mx.fast.scaled_dot_product_attention`, whose
    CPU build makes a graph of several ops where the GPU's is one node); the cache is put back
    after each call so that every call sees 16 cached positions."""
    from mlx_lm.models.cache import KVCache

    from bi_rl import backends
    from bi_rl.backends.cuda import attention, hopper_attention
    from bi_rl.bench import e2e
    from bi_rl.concat import concatenated
    from bi_rl.fusion import grouping
    from bi_rl.mode import named_mode

    attention.kernel = hopper_attention.kernel = lambda spec: stand_in
    hopper_attention.prepare = lambda *a: True
    w = e2e.WORKLOADS["qwen3-1.7b"]
    module = e2e.models_module(w.model_type)
    cfg = e2e.model_config(w) | {"num_hidden_layers": 1}
    model = module.Model(module.ModelArgs.from_dict(cfg))
    model.set_dtype(mx.bfloat16)
    nn.quantize(model, group_size=64, bits=4)
    mx.eval(model.parameters())
    layer, cache = model.layers[0], KVCache()
    x = mx.zeros((1, 1, w.shape["hidden_size"]), mx.bfloat16)
    stock_attention = (
        nullcontext()
        if mode
        else patch.object(
            mx.fast, "scaled_dot_product_attention", lambda q, *a, **k: mx.zeros(q.shape, q.dtype)
        )
    )
    with stock_attention, backends.use(cuda.BACKEND), named_mode("strict" if mode else "off"):
        layer(mx.zeros((1, 16, w.shape["hidden_size"]), mx.bfloat16), None, cache)
        mx.eval(cache.state)

        def call():
            offset, keys, values = cache.offset, cache.keys, cache.values
            layer(x, None, cache)
            # the cache's own arrays back, not only its offset: each call would otherwise
            # chain a lazy update onto the last and the unevaluated graph grow without end
            cache.offset, cache.keys, cache.values = offset, keys, values

        with concatenated(model, concat), grouping(model, mode):
            return per_call_us(call, 300)


def main(argv=None) -> int:
    argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter
    ).parse_args(argv)
    from bi_rl import backends, ops
    from bi_rl.backends import cuda
    from bi_rl.backends.cuda import hopper, hopper_qmm
    from bi_rl.backends.cuda import qmm as cuda_qmm
    from bi_rl.logprobs import row_fingerprints, token_logprobs
    from bi_rl.mode import batch_invariant_mode
    from bi_rl.rollout.sampler import SamplerConfig, row_keys, sample

    def stand_in(**kw):
        shapes, dtypes = kw["output_shapes"], kw["output_dtypes"]
        return [mx.zeros(s, d) for s, d in zip(shapes, dtypes, strict=True)]

    hopper.kernel = lambda spec: stand_in
    hopper.prepare = lambda *a: True
    hopper.available = lambda: True
    x, w = mx.zeros((1, 1, 2048), mx.bfloat16), mx.zeros((6144, 2048), mx.bfloat16)
    mx.eval(x, w)
    rows = [
        (
            "stand-in kernel call alone",
            lambda: stand_in(output_shapes=[(1, 6144)], output_dtypes=[x.dtype]),
        ),
        ("hopper.gemm", lambda: hopper.gemm(x, w, b_kn=False)),
        ("cuda backend linear", lambda: cuda.linear(x, w)),
    ]
    for name, fn in rows:
        print(f"{name:<44} {per_call_us(fn):7.1f} us")
    with backends.use(cuda.BACKEND):
        us = per_call_us(lambda: ops.linear(x, w))
        print(f"{'bi_rl.ops.linear (cuda backend)':<44} {us:7.1f} us")
    print(f"{'stock x @ w.T (graph node)':<44} {per_call_us(lambda: x @ w.T):7.1f} us")
    # quantized (4-bit, groups of 64): the backend's call, bi_rl.ops, and nn.QuantizedLinear
    # inside the mode, against stock's graph node
    hopper_qmm.kernel = lambda spec: stand_in
    hopper_qmm.prepare = lambda *a: True
    layer = nn.QuantizedLinear(2048, 6144, bias=False, group_size=64, bits=4)
    layer.set_dtype(mx.bfloat16)
    wq, sc, bi = layer["weight"], layer["scales"], layer["biases"]
    mx.eval(layer.parameters())
    qargs = (x, wq, sc, bi, True, 64, 4)
    us = per_call_us(lambda: cuda_qmm.quantized_matmul(*qargs))
    print(f"{'cuda backend quantized_matmul':<44} {us:7.1f} us")
    with backends.use(cuda.BACKEND):
        us = per_call_us(lambda: ops.quantized_matmul(*qargs))
        print(f"{'bi_rl.ops.quantized_matmul (cuda backend)':<44} {us:7.1f} us")
        with batch_invariant_mode():
            us = per_call_us(lambda: layer(x))
        print(f"{'nn.QuantizedLinear in the mode (cuda)':<44} {us:7.1f} us")
    us = per_call_us(lambda: mx.quantized_matmul(*qargs))
    print(f"{'stock mx.quantized_matmul (graph node)':<44} {us:7.1f} us")
    # q/k/v of the 1.7B shape: three QuantizedLinear calls in the mode, grouped (one launch,
    # bi_rl.fusion) and not, against stock's three nodes
    from bi_rl.fusion import group_projections, ungroup_projections

    class Attn(nn.Module):
        def __init__(self):
            super().__init__()
            for name, n in (("q_proj", 2048), ("k_proj", 1024), ("v_proj", 1024)):
                lin = nn.QuantizedLinear(2048, n, bias=False, group_size=64, bits=4)
                lin.set_dtype(mx.bfloat16)
                setattr(self, name, lin)

    attn = Attn()
    mx.eval(attn.parameters())

    def qkv():
        return attn.q_proj(x), attn.k_proj(x), attn.v_proj(x)

    hopper.prepare_group = hopper_qmm.prepare_group = lambda *a: True
    with backends.use(cuda.BACKEND), batch_invariant_mode():
        separate = per_call_us(qkv, 1000)
        group_projections(attn)
        grouped = per_call_us(qkv, 1000)
        ungroup_projections(attn)
    print(f"{'q/k/v QuantizedLinear in the mode, separate':<44} {separate:7.1f} us")
    print(f"{'q/k/v QuantizedLinear in the mode, grouped':<44} {grouped:7.1f} us")
    print(f"{'q/k/v stock nn.QuantizedLinear':<44} {per_call_us(qkv, 1000):7.1f} us")
    # the same three as one product over concatenated weights (bi_rl.concat), each member
    # taking its columns: stock and in the mode
    from bi_rl.concat import concatenated

    with concatenated(attn) as sets:
        assert sets == 1, "guard: the three projections were concatenated"
        stock_concat = per_call_us(qkv, 1000)
        with backends.use(cuda.BACKEND), batch_invariant_mode():
            mode_concat = per_call_us(qkv, 1000)
    print(f"{'q/k/v stock, concatenated':<44} {stock_concat:7.1f} us")
    print(f"{'q/k/v in the mode, concatenated':<44} {mode_concat:7.1f} us")
    # one decoder layer of the 1.7B shape in 4-bit at a decode step (one token over a cache of
    # 16), stock and in the mode with its projections grouped as a rollout groups them
    print(f"{'decoder layer, stock (mode off)':<44} {_layer_us(cuda, stand_in, False):7.1f} us")
    print(f"{'decoder layer in the mode, grouped':<44} {_layer_us(cuda, stand_in, True):7.1f} us")
    for mode, name in ((False, "stock"), (True, "in the mode")):
        us = _layer_us(cuda, stand_in, mode, concat=True)
        print(f"{f'decoder layer, {name}, concatenated':<44} {us:7.1f} us")
    logits = mx.zeros((1, 151936), mx.bfloat16)
    mx.eval(logits)
    for cfg in (SamplerConfig(temperature=1.0), SamplerConfig(temperature=1.0, top_p=0.95)):

        def post(cfg=cfg):
            t = sample(logits, row_keys(0, [(123, 7)]), cfg)
            return t, token_logprobs(logits, t, cfg.temperature), row_fingerprints(logits)

        label = f"engine post-step graph, top-p {cfg.top_p}"
        print(f"{label:<44} {per_call_us(post, 1000):7.1f} us")
    print(f"{'bare step argmax':<44} {per_call_us(lambda: mx.argmax(logits, axis=-1)):7.1f} us")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
