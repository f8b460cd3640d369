"""Decode at batch 1 and 2 over 32768 and 131072 keys (Qwen3-1.7B heads), split mode forced
at 8, 16 and 32 splits a block (128, 64 and 32 blocks at B = 1 over 32768 keys) beside the
dispatcher's pick (16) and stock MLX, medians of 15 samples in one process. The twenty-first
session found 16 splits a block faster than 1 and 4 at B = 1 although it leaves half the
multiprocessors idle; 8 (every multiprocessor a block) and 32 (fewer, longer blocks) were
never tried. Speed only: SPB cannot move a bit (attention.cu), and the GPU tests compare
1, 4 and 16.

    PYTHONPATH=<arm> python3 -P docs/h200/2026-12-03/s22/next/splits.py
"""

from __future__ import annotations

import mlx.core as mx

from bi_rl import _stock
from bi_rl.backends.cuda import attention as A
from bi_rl.bench.timing import compare
from bi_rl.verify.core import rand

BF16 = mx.bfloat16


def main() -> None:
    scale = 128**-0.5
    for b, keys in ((1, 32768), (2, 32768), (1, 131072), (2, 131072)):
        q = rand((b, 16, 1, 128), BF16, 1)
        k, v = rand((b, 8, keys, 128), BF16, 2), rand((b, 8, keys, 128), BF16, 3)
        mx.eval(q, k, v)
        pick = A.choose_config(b, 8, 2, keys, 128)
        for cfg in (None, *(A.AttnConfig(1, 2, True, n) for n in (8, 16, 32))):

            def ours(q=q, k=k, v=v, cfg=cfg):
                return A.scaled_dot_product_attention(q, k, v, scale, None, config=cfg)

            def stock(q=q, k=k, v=v):
                return _stock.scaled_dot_product_attention(q, k, v, scale=scale)

            t_ours, t_stock = compare(ours, stock)
            name = f"pick {pick}" if cfg is None else str(cfg)
            print(
                f"B={b} keys={keys} {name}: {t_ours.median_s * 1e6:.1f} us, stock "
                f"{t_stock.median_s * 1e6:.1f} us, ratio {t_ours.median_s / t_stock.median_s:.2f}",
                flush=True,
            )


if __name__ == "__main__":
    main()
