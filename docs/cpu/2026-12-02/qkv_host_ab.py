"""Host time of a layer's three q/k/v projections (Qwen3-1.7B shape, 4-bit, or bf16 with
--dense) called inside the mode on the CUDA backend with stand-in kernels (zeros of the
output shapes), separately and grouped by bi_rl.fusion, on any machine: min of 5 x 2000 calls,
microseconds per q/k/v. Run it in two trees (old and new bi_rl/fusion.py) in alternating
processes and compare grouped/separate within each process: the times of a shared CPU move
between runs, the ratio less."""

import sys
import timeit

import mlx.core as mx
import mlx.nn as nn

from bi_rl import backends
from bi_rl.backends import cuda
from bi_rl.backends.cuda import hopper, hopper_qmm
from bi_rl.fusion import group_projections
from bi_rl.mode import batch_invariant_mode


def stand_in(**kw):
    shapes, dtypes = kw["output_shapes"], kw["output_dtypes"]
    return [mx.zeros(s, d) for s, d in zip(shapes, dtypes, strict=True)]


hopper.kernel = hopper_qmm.kernel = lambda spec: stand_in
hopper.prepare = hopper.prepare_group = lambda *a: True
hopper_qmm.prepare = hopper_qmm.prepare_group = lambda *a: True
hopper.available = lambda: True
dense = "--dense" in sys.argv


class Attn(nn.Module):
    def __init__(self):
        super().__init__()
        for name, n in (("q_proj", 2048), ("k_proj", 1024), ("v_proj", 1024)):
            if dense:
                lin = nn.Linear(2048, n, bias=False)
            else:
                lin = nn.QuantizedLinear(2048, n, bias=False, group_size=64, bits=4)
            lin.set_dtype(mx.bfloat16)
            setattr(self, name, lin)


attn = Attn()
mx.eval(attn.parameters())
x = mx.zeros((1, 1, 2048), mx.bfloat16)


def qkv():
    return attn.q_proj(x), attn.k_proj(x), attn.v_proj(x)


def us():
    return min(timeit.repeat(qkv, number=2000, repeat=5)) / 2000 * 1e6


with backends.use(cuda.BACKEND), batch_invariant_mode():
    separate = us()
    group_projections(attn)
    grouped = us()
print(f"separate {separate:.1f} us  grouped {grouped:.1f} us  ratio {grouped / separate:.2f}")
