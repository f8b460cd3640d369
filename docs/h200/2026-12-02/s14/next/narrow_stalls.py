# One launch of the few-row kernel at the dispatcher's pick (16 columns, 2 warps, 12 stages)
# and one of stock's GEMV at M = 1, K = 6144, N = 2048 (the projection furthest from its
# target, 1.64x), for `ncu --set full --profile-from-start off`: its warp stall reasons say
# whether the MMA chain's latency or the fragment reads set its time. Run from the
# repository root, e.g.
#   ncu --clock-control none --profile-from-start off --set full \
#     python3 docs/h200/2026-12-02/s14/next/narrow_stalls.py > narrow-stalls.txt
import sys

sys.path.insert(0, "tools")
import mlx.core as mx
from cuda.bindings import driver
from hopper_check import rand

from bi_rl.backends.cuda import hopper

w = rand((2048, 6144), mx.bfloat16, 10, 6144**-0.5)
a = rand((1, 6144), mx.bfloat16, 3)
pick = hopper.choose_config(1, 2048, 6144)
assert pick == hopper.NARROW_SPREAD, pick
ops = [lambda: hopper.gemm(a, w, b_kn=False, config=pick), lambda: a @ w.T]
for fn in ops:
    mx.eval(fn())
mx.synchronize()
driver.cuProfilerStart()
for fn in ops:
    mx.eval(fn())
    mx.synchronize()
driver.cuProfilerStop()
