# The few-row GEMM at M = 1, 8 on the Qwen3-1.7B and Llama-3-8B projection shapes: one-warp
# blocks (no block barrier, one or two 8-column chains a warp) against the dispatcher's pick
# and stock MLX, in one process (weights cycled past L2; median of the tool's timer). Every
# configuration's output bits are compared with the pick's.
import itertools
import sys

sys.path.insert(0, "tools")
import mlx.core as mx
from hopper_check import LLAMA3_8B, QWEN3_17B, rand, timed

from bi_rl.backends.cuda import hopper
from bi_rl.verify.core import bits

BF16 = mx.bfloat16
CANDIDATES = [
    hopper.NarrowConfig(1, 1, 8),
    hopper.NarrowConfig(1, 1, 12),
    hopper.NarrowConfig(1, 1, 16),
    hopper.NarrowConfig(2, 1, 12),
    hopper.NarrowConfig(1, 2, 16),
]
for k, n in QWEN3_17B + LLAMA3_8B:
    nbytes = n * k * 2
    copies = max(1, min(8, -(-240_000_000 // nbytes)))
    ws = [rand((n, k), BF16, 10 + i, k**-0.5) for i in range(copies)]
    mx.eval(ws)
    for m in (1, 8):
        a = rand((m, k), BF16, 3)
        pick = itertools.cycle(ws).__next__
        t_stock = timed(lambda a=a, pick=pick: a @ pick().T)
        p = hopper.pick_narrow(n)
        ref = bits(hopper.gemm(a, ws[0], b_kn=False, config=p))
        t_p = timed(lambda a=a, pick=pick, p=p: hopper.gemm(a, pick(), b_kn=False, config=p))
        row = f"M={m:2d} K={k:5d} N={n:6d}: stock {t_stock * 1e6:7.1f} us"
        row += f"  pick {p.nt}/{p.warps}/{p.stages} {t_p * 1e6:7.1f} ({t_p / t_stock:4.2f})"
        for c in CANDIDATES:
            out = hopper.gemm(a, ws[0], b_kn=False, config=c)
            same = (bits(out) == ref).all()
            t = timed(lambda c=c, a=a, pick=pick: hopper.gemm(a, pick(), b_kn=False, config=c))
            row += f"  {c.nt}/{c.warps}/{c.stages}{'' if same else ' BITS-DIFFER'}"
            row += f" {t * 1e6:7.1f} ({t / t_stock:4.2f})"
        print(row, f"  [{nbytes / 1e6:.0f} MB]", flush=True)
