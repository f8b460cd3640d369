# Where the mode's extra host time in one 4-bit Qwen3-1.7B-shaped decoder layer (decode step,
# batch 1) comes from: tools/host_cost.py's layer, stock and in the mode, then in the mode with
# the quantized projections stock (nn.QuantizedLinear and mx.quantized_matmul unpatched), then
# with attention a one-node stand-in too. Kernels are stand-ins (host time only). Two rounds.
# Run from the repository root: python docs/cpu/2026-12-02/host_isolate.py
import sys

sys.path.insert(0, "tools")
import host_cost as H
import mlx.core as mx
import mlx.nn as nn

import bi_rl.mode as M
from bi_rl.backends import cuda
from bi_rl.backends.cuda import hopper, hopper_qmm


def stand_in(**kw):
    return [mx.zeros(s, d) for s, d in zip(kw["output_shapes"], kw["output_dtypes"], strict=True)]


hopper.kernel = hopper_qmm.kernel = lambda spec: stand_in
hopper.prepare = hopper_qmm.prepare = lambda *a: True
hopper.available = lambda: True


def stock_projections(owner, attr, wrapper):
    if owner is nn.QuantizedLinear and attr == "__call__":
        return M._stock.quantized_linear_call
    return M._stock.quantized_matmul if attr == "quantized_matmul" else wrapper


def attention_stub(owner, attr, wrapper):
    if attr == "scaled_dot_product_attention":
        return lambda q, *args, **kw: mx.zeros(q.shape, q.dtype)
    return wrapper


for _ in range(2):
    print(f"{'stock layer':<45} {H._layer_us(cuda, stand_in, False):7.1f} us", flush=True)
    print(f"{'mode layer':<45} {H._layer_us(cuda, stand_in, True):7.1f} us", flush=True)
    M._PATCHES[:] = [(o, a, stock_projections(o, a, w)) for o, a, w in M._PATCHES]
    us = H._layer_us(cuda, stand_in, True)
    print(f"{'mode layer, projections stock':<45} {us:7.1f} us", flush=True)
    M._PATCHES[:] = [(o, a, attention_stub(o, a, w)) for o, a, w in M._PATCHES]
    us = H._layer_us(cuda, stand_in, True)
    print(f"{'mode layer, projections and attention stock':<45} {us:7.1f} us", flush=True)
    M._PATCHES[:] = M._patch_table()
