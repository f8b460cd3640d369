"""The few-row quantized kernel's 16-column blocks with 0, 2, 4 and 8 producer warps forced, at
M = 1 and 8 over the Qwen3-1.7B and Llama-3-8B projections (4-bit, group 64), beside stock
MLX's quantized matmul, medians of 15 samples in one process: how many producer warps the
dispatcher should give them. Speed only (the GPU tests compare every configuration's bits).
Needs producers.patch applied (arm prod):

    PYTHONPATH=<arm> python3 -P docs/h200/2026-12-03/s21/next/producers_forced.py
"""

from __future__ import annotations

import mlx.core as mx

from bi_rl.backends.cuda import hopper_qmm as Q
from bi_rl.bench.timing import compare
from bi_rl.verify.core import rand

BF16 = mx.bfloat16
SHAPES = ((2048, 2048), (2048, 6144), (6144, 2048), (4096, 4096), (14336, 4096))


def main() -> None:
    for k, n in SHAPES:
        wq, sc, bi = mx.quantize(rand((n, k), BF16, 3, k**-0.5), group_size=64, bits=4)
        mx.eval(wq, sc, bi)
        for m in (1, 8):
            x = rand((m, k), BF16, 4)
            mx.eval(x)
            for p in (0, 2, 4, 8):
                cfg = Q.QNarrowConfig(1, 2, 12, bits=4, producers=p)

                def ours(x=x, cfg=cfg, wq=wq, sc=sc, bi=bi):
                    return Q.quantized_matmul(x, wq, sc, bi, 64, 4, config=cfg)

                def stock(x=x, wq=wq, sc=sc, bi=bi):
                    return mx.quantized_matmul(x, wq, sc, bi, True, 64, 4)

                t_ours, t_stock = compare(ours, stock)
                print(
                    f"M={m} K={k} N={n} producers={p}: {t_ours.median_s * 1e6:.1f} us, stock "
                    f"{t_stock.median_s * 1e6:.1f} us, ratio "
                    f"{t_ours.median_s / t_stock.median_s:.2f}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
