"""Decode attention (one query token a row, Qwen3-1.7B heads: 16 query / 8 KV, head dim 128)
at the dispatcher's pick beside stock MLX, medians of 15 samples alternating with stock in one
process, one JSON line a cell: the split-mode cells (where the combine kernel runs) at B = 1,
2, 8 and 64, and one sequential-mode cell as a control that the arm changes nothing there.
Run once per arm, alternating (PYTHONPATH picks the arm):

    PYTHONPATH=<arm> python3 -P docs/h200/2026-12-03/s23/next/decode_ab.py LABEL >> decode-ab.jsonl
"""

from __future__ import annotations

import sys

import mlx.core as mx
import orjson

from bi_rl import _stock
from bi_rl.backends.cuda import attention as A
from bi_rl.bench.kernels import rand_rows
from bi_rl.bench.timing import compare
from bi_rl.verify.core import rand

BF16 = mx.bfloat16
CELLS = ((1, 32768), (2, 32768), (1, 131072), (2, 131072), (8, 32768), (64, 32768), (1, 8192))


def main() -> None:
    label, scale = sys.argv[1], 128**-0.5
    for b, keys in CELLS:
        q = rand((b, 16, 1, 128), BF16, 1)
        k, v = rand_rows((b, 8, keys, 128), BF16, 2), rand_rows((b, 8, keys, 128), BF16, 3)
        mx.eval(q, k, v)
        pick = A.choose_config(b, 8, 2, keys, 128)

        def ours(q=q, k=k, v=v):
            return A.scaled_dot_product_attention(q, k, v, scale, None)

        def stock(q=q, k=k, v=v):
            return _stock.scaled_dot_product_attention(q, k, v, scale=scale)

        t_ours, t_stock = compare(ours, stock)
        row = {
            "arm": label,
            "b": b,
            "keys": keys,
            "config": str(pick),
            "ours_us": t_ours.median_s * 1e6,
            "stock_us": t_stock.median_s * 1e6,
            "ratio": t_ours.median_s / t_stock.median_s,
            "spread": max(t_ours.spread, t_stock.spread),
        }
        print(orjson.dumps(row).decode(), flush=True)
        del q, k, v


if __name__ == "__main__":
    main()
