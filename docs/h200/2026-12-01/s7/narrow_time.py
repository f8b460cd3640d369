# The few-row GEMM (mma.sync, gemm_narrow.cu) against the wgmma configuration the dispatcher
# picks and stock MLX, at M = 1, 8, 16 on the Qwen3-1.7B and Llama-3-8B projection shapes, in
# one process (weights cycled past L2; median of the tool's timer).
import itertools
import sys

sys.path.insert(0, "tools")
import mlx.core as mx
from hopper_check import LLAMA3_8B, QWEN3_17B, rand, timed

from bi_rl.backends.cuda import hopper

BF16 = mx.bfloat16
for k, n in QWEN3_17B + LLAMA3_8B:
    nbytes = n * k * 2
    copies = max(1, min(8, -(-240_000_000 // nbytes)))
    ws = [rand((n, k), BF16, 10 + i, k**-0.5) for i in range(copies)]
    mx.eval(ws)
    for m in (1, 8, 16):
        a = rand((m, k), BF16, 3)
        pick = itertools.cycle(ws).__next__
        t_stock = timed(lambda a=a, pick=pick: a @ pick().T)
        wg = hopper.choose_config(m, n, k)
        t_wg = timed(lambda a=a, pick=pick, wg=wg: hopper.gemm(a, pick(), b_kn=False, config=wg))
        row = f"M={m:2d} K={k:5d} N={n:6d}: stock {t_stock * 1e6:7.1f} us"
        row += f"  wgmma {t_wg * 1e6:7.1f} ({t_wg / t_stock:4.2f})"
        for c in hopper.NARROW:
            t = timed(lambda c=c, a=a, pick=pick: hopper.gemm(a, pick(), b_kn=False, config=c))
            mark = "*" if c == hopper.pick_narrow(n) else " "
            row += f"  {c.bn}x{c.warps}x{c.stages}{mark} {t * 1e6:7.1f} ({t / t_stock:4.2f})"
        print(row, f"  [{nbytes / 1e6:.0f} MB]", flush=True)
