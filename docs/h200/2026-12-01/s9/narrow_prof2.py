# One launch each of the few-row kernel (16 columns, 2 warps, 12 stages: the dispatcher's pick
# here; then 32 columns, 4 warps, 8 stages, as profiled before) and stock's GEMV at M = 1,
# K = 14336, N = 4096, for `ncu --set full --profile-from-start off`.
import sys

sys.path.insert(0, "tools")
import mlx.core as mx
from cuda.bindings import driver
from hopper_check import rand

from bi_rl.backends.cuda import hopper

w = rand((4096, 14336), mx.bfloat16, 10, 14336**-0.5)
a = rand((1, 14336), mx.bfloat16, 3)
ops = [
    lambda c=c: hopper.gemm(a, w, b_kn=False, config=c)
    for c in (hopper.NarrowConfig(1, 2, 12), hopper.NarrowConfig(1, 4, 8))
]
ops.append(lambda: a @ w.T)
for fn in ops:
    mx.eval(fn())
mx.synchronize()
driver.cuProfilerStart()
for fn in ops:
    mx.eval(fn())
    mx.synchronize()
driver.cuProfilerStop()
