# Host time of the calls one 4-bit Qwen3-1.7B-shaped decoder layer makes at a decode step
# (batch 1), stock MLX against the mode (CUDA backend, projections grouped as a rollout groups
# them: bi_rl.fusion.grouping), every CUDA kernel a stand-in that returns zeros of the output's
# shape, and stock's fused attention a one-node stand-in: what the mode's Python adds per call,
# on any machine.
# Three rounds, the fastest of each (host time only gains noise). Run from the repository
# root: python docs/cpu/2026-12-02/host_parts.py
import sys

sys.path.insert(0, "tools")
import mlx.core as mx
import mlx.nn as nn
from host_cost import per_call_us

from bi_rl import backends
from bi_rl.backends import cuda
from bi_rl.backends.cuda import attention, hopper, hopper_attention, hopper_qmm
from bi_rl.fusion import grouping
from bi_rl.mode import batch_invariant_mode


def stand_in(**kw):
    return [mx.zeros(s, d) for s, d in zip(kw["output_shapes"], kw["output_dtypes"], strict=True)]


for mod in (hopper, hopper_qmm, attention, hopper_attention):
    mod.kernel = lambda spec: stand_in
hopper.prepare = hopper_qmm.prepare = hopper_attention.prepare = lambda *a: True
hopper.prepare_group = hopper_qmm.prepare_group = lambda *a: True
hopper.available = lambda: True


def qlinear(k, n):
    lin = nn.QuantizedLinear(k, n, bias=False, group_size=64, bits=4)
    lin.set_dtype(mx.bfloat16)
    return lin


class Attn(nn.Module):
    def __init__(self):
        super().__init__()
        self.q_proj, self.k_proj = qlinear(2048, 2048), qlinear(2048, 1024)
        self.v_proj, self.o_proj = qlinear(2048, 1024), qlinear(2048, 2048)


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.gate_proj, self.up_proj = qlinear(2048, 6144), qlinear(2048, 6144)
        self.down_proj = qlinear(6144, 2048)


a, m = Attn(), MLP()
x, h = mx.zeros((1, 1, 2048), mx.bfloat16), mx.zeros((1, 1, 6144), mx.bfloat16)
q, kv = mx.zeros((1, 16, 1, 128), mx.bfloat16), mx.zeros((1, 8, 17, 128), mx.bfloat16)
mx.eval(a.parameters(), m.parameters(), x, h, q, kv)
cases = {
    "q/k/v": lambda: (a.q_proj(x), a.k_proj(x), a.v_proj(x)),
    "o": lambda: a.o_proj(x),
    "gate/up": lambda: (m.gate_proj(x), m.up_proj(x)),
    "down": lambda: m.down_proj(h),
    "attention": lambda: mx.fast.scaled_dot_product_attention(q, kv, kv, scale=0.1),
}
stock_attention = mx.fast.scaled_dot_product_attention
res = {}
for _ in range(3):
    mx.fast.scaled_dot_product_attention = lambda q, *args, **kw: mx.zeros(q.shape, q.dtype)
    for name, fn in cases.items():
        res.setdefault(name, {}).setdefault("stock", []).append(per_call_us(fn, 1000))
    mx.fast.scaled_dot_product_attention = stock_attention
    with backends.use(cuda.BACKEND), batch_invariant_mode(), grouping(a), grouping(m):
        for name, fn in cases.items():
            res[name].setdefault("mode", []).append(per_call_us(fn, 1000))
print(f"{'call':<10} {'stock us':>9} {'mode us':>9} {'extra us':>9}")
total = 0.0
for name, r in res.items():
    s, md = min(r["stock"]), min(r["mode"])
    total += md - s
    print(f"{name:<10} {s:9.2f} {md:9.2f} {md - s:9.2f}")
print(f"{'layer sum':<10} {'':>9} {'':>9} {total:9.2f}")
