"""The few-row quantized GEMM as the dispatcher picks it, beside stock MLX's quantized matmul, at
M = 1 and 8 over the Qwen3-1.7B and Llama-3-8B projections (4-bit and 8-bit, group 64), medians
of 15 samples alternating with stock in one process. Run once per arm (PYTHONPATH picks the
arm, BI_RL_CUDA_CACHE its kernel cache) and twice for the arm measured first, so that an
arm's gain shows against the spread between two runs of the same code:

    PYTHONPATH=<arm> python3 -P docs/h200/2026-12-03/s22/qmm_ab.py LABEL > LABEL.jsonl
"""

from __future__ import annotations

import sys

import mlx.core as mx
import orjson

from bi_rl.backends.cuda import hopper_qmm as Q
from bi_rl.bench.timing import compare
from bi_rl.verify.core import rand

BF16 = mx.bfloat16
SHAPES = ((2048, 2048), (2048, 6144), (6144, 2048), (4096, 4096), (4096, 14336), (14336, 4096))


def main() -> None:
    label = sys.argv[1]
    for bits in (4, 8):
        for k, n in SHAPES if bits == 4 else SHAPES[:3]:
            wq, sc, bi = mx.quantize(rand((n, k), BF16, 3, k**-0.5), group_size=64, bits=bits)
            mx.eval(wq, sc, bi)
            for m in (1, 8):
                x = rand((m, k), BF16, 4)
                mx.eval(x)
                cfg = Q.choose_config(m, n, k, bits)

                def ours(x=x, wq=wq, sc=sc, bi=bi, bits=bits):
                    return Q.quantized_matmul(x, wq, sc, bi, 64, bits)

                def stock(x=x, wq=wq, sc=sc, bi=bi, bits=bits):
                    return mx.quantized_matmul(x, wq, sc, bi, True, 64, bits)

                t_ours, t_stock = compare(ours, stock)
                row = {
                    "arm": label,
                    "bits": bits,
                    "m": m,
                    "k": k,
                    "n": n,
                    "config": str(cfg),
                    "ours_us": round(t_ours.median_s * 1e6, 2),
                    "stock_us": round(t_stock.median_s * 1e6, 2),
                    "ratio": round(t_ours.median_s / t_stock.median_s, 3),
                    "spread": round(max(t_ours.spread, t_stock.spread), 3),
                }
                print(orjson.dumps(row).decode(), flush=True)


if __name__ == "__main__":
    main()
