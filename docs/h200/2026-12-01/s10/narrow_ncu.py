# GPU time of one launch of each few-row configuration, the wgmma configuration the dispatcher
# picks past the few-row kernel, and stock MLX, at M = 1 and 8 on the 1.7B and 8B projection
# shapes: run under `ncu --profile-from-start off`; each case ends with an arange kernel whose
# length is the case number, so that the CSV's kernels can be grouped by case.
import sys

sys.path.insert(0, "tools")
import mlx.core as mx
from cuda.bindings import driver
from hopper_check import LLAMA3_8B, QWEN3_17B, rand

from bi_rl.backends.cuda import hopper

BF16 = mx.bfloat16
cases = []
for k, n in QWEN3_17B + LLAMA3_8B:
    w = rand((n, k), BF16, 10, k**-0.5)
    for m in (1, 8):
        a = rand((m, k), BF16, 3)
        mx.eval(w, a)
        wg = [c for c in hopper.configs() if not c.narrow]
        ops = [
            ("stock", lambda a=a, w=w: a @ w.T),
            (
                "wgmma",
                lambda a=a, w=w, m=m, n=n, wg=wg: hopper.gemm(
                    a, w, b_kn=False, config=hopper.pick(wg, m, n)
                ),
            ),
        ]
        extra = [
            getattr(hopper, x)
            for x in ("NARROW_TWO_WARPS", "NARROW_UNPICKED")
            if hasattr(hopper, x)
        ]
        extra += list(getattr(hopper, "NARROW_KT2", []))
        ops += [
            (
                f"{c.bn}x{c.warps}x{c.stages}" + (f"k{c.kt}" if getattr(c, "kt", 1) > 1 else ""),
                lambda a=a, w=w, c=c: hopper.gemm(a, w, b_kn=False, config=c),
            )
            for c in (*hopper.NARROW, *extra)
        ]
        for label, fn in ops:
            cases.append((f"M={m} K={k} N={n} {label}", fn))
for _, fn in cases:  # compile and load everything outside the profiled range
    mx.eval(fn())
for i in range(len(cases) + 2):
    mx.eval(mx.arange(i + 1))
mx.synchronize()
print(driver.cuProfilerStart())
for i, (label, fn) in enumerate(cases):
    print(i + 1, label, flush=True)
    mx.eval(fn())
    mx.synchronize()
    mx.eval(mx.arange(i + 1))
    mx.synchronize()
print(driver.cuProfilerStop())
