"""Run the kernels whose speed misses its target a few times each, for Nsight Compute to read.

    ncu --clock-control none -k regex:custom_kernel_bi --launch-skip 2 --launch-count 1 \\
        --section SpeedOfLight --section Occupancy --section WarpStateStats \\
        python tools/cuda_profile.py CASE

CASE is one of the names in CASES (each launches its kernel 3 times: two warm-ups that ncu
skips, then the one it profiles). The point is what limits each kernel (memory or compute
throughput, occupancy, stall reasons) where BENCHMARK.md records a miss. A `stock-` case runs
stock MLX's kernel on the same inputs (cuBLAS for a GEMM: profile it with a regex that matches
its kernel's name, e.g. `-k regex:'gemm|nvjet'`), for the side-by-side profile.
"""

from __future__ import annotations

import argparse
import sys

import mlx.core as mx

from bi_rl import _stock
from bi_rl.backends.cuda import attention, gemm, qmm
from bi_rl.verify.core import rand

BF16 = mx.bfloat16


def _gemm(m, k, n, stock=False, config=None):
    """ours (the dispatcher's pick, or a forced Hopper configuration) or stock's x @ w.T."""
    x, w = rand((m, k), BF16, 1), rand((n, k), BF16, 2, scale=k**-0.5)
    if stock:
        return lambda: _stock.linear(x, w)
    if config is not None:
        from bi_rl.backends.cuda import hopper

        cfg = getattr(hopper, config)
        return lambda: hopper.gemm(x, w, b_kn=False, config=cfg)
    return lambda: gemm.linear(x, w)


def _qmm(m, k, n, stock=False):
    """ours (the CUDA backend's 4-bit product, groups of 64) or stock's on the same inputs."""
    wq, s, b = mx.quantize(rand((n, k), BF16, 3, scale=k**-0.5), group_size=64, bits=4)
    x = rand((m, k), BF16, 4)
    op = _stock.quantized_matmul if stock else qmm.quantized_matmul
    return lambda: op(x, wq, s, b, True, 64, 4)


def _decode(b, keys):
    q = rand((b, 14, 1, 64), BF16, 5)
    k, v = rand((b, 2, keys, 64), BF16, 6), rand((b, 2, keys, 64), BF16, 7)
    return lambda: attention.scaled_dot_product_attention(q, k, v, 64**-0.5)


def _decode_17b(b, keys):
    """Decode over Qwen3-1.7B's heads (16 query / 8 KV, head dim 128): split mode and its
    combine kernel at B = 1 over 32768 keys."""
    q = rand((b, 16, 1, 128), BF16, 5)
    k, v = rand((b, 8, keys, 128), BF16, 6), rand((b, 8, keys, 128), BF16, 7)
    return lambda: attention.scaled_dot_product_attention(q, k, v, 128**-0.5)


def _prefill(t):
    q, k, v = (rand((1, 14 if i == 0 else 2, t, 64), BF16, 8 + i) for i in range(3))
    return lambda: attention.scaled_dot_product_attention(q, k, v, 64**-0.5, "causal")


CASES = {
    "gemm-m1": lambda: _gemm(1, 4096, 4096),
    "gemm-m4096": lambda: _gemm(4096, 4096, 4096),
    # prefill / rescoring rows on Qwen3-1.7B's q projection and its logits, ours and stock
    "gemm-m4096-q": lambda: _gemm(4096, 2048, 2048),
    "stock-gemm-m4096-q": lambda: _gemm(4096, 2048, 2048, stock=True),
    "gemm-m4096-logits": lambda: _gemm(4096, 2048, 151936),
    "stock-gemm-m4096-logits": lambda: _gemm(4096, 2048, 151936, stock=True),
    # the same on the 128 x 128 blocks that fit two to a multiprocessor (hopper.TWO_PER_SM)
    "gemm-m4096-q-two": lambda: _gemm(4096, 2048, 2048, config="TWO_PER_SM"),
    "gemm-m4096-logits-two": lambda: _gemm(4096, 2048, 151936, config="TWO_PER_SM"),
    "qmm-m1": lambda: _qmm(1, 4096, 4096),
    "qmm-m1-down": lambda: _qmm(1, 6144, 2048),
    "decode-b64-32k": lambda: _decode(64, 32768),
    "decode-b64-8k": lambda: _decode(64, 8192),
    "decode-b1-32k-d128": lambda: _decode_17b(1, 32768),
    "prefill-8k": lambda: _prefill(8192),
}
# Decode-sized products on Qwen3-1.7B's projections (and Llama-3-8B's square one in bf16),
# 4-bit and bf16, ours and stock: the kernels' own time, apart from the graph building that
# bi-bench's per-call figure includes, and (ncu flushing the caches between kernels by
# default) with the weights read from memory as a model's decode step reads them, where
# bi-bench's back-to-back calls on one weight find it in L2.
for _m in (1, 8, 64):
    for _k, _n in ((2048, 2048), (2048, 6144), (6144, 2048), (4096, 4096)):
        for _stock_side in (False, True):
            _side = "stock-" if _stock_side else ""
            CASES[f"{_side}gemm-m{_m}-{_k}x{_n}"] = lambda m=_m, k=_k, n=_n, st=_stock_side: _gemm(
                m, k, n, stock=st
            )
            if _k != 4096:
                CASES[f"{_side}qmm-m{_m}-{_k}x{_n}"] = lambda m=_m, k=_k, n=_n, st=_stock_side: (
                    _qmm(m, k, n, st)
                )


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("cases", nargs="*", metavar="CASE", help=f"default all: {', '.join(CASES)}")
    names = p.parse_args(argv).cases or list(CASES)
    unknown = [n for n in names if n not in CASES]
    if unknown:
        p.error(f"unknown case {', '.join(unknown)}; choose from {', '.join(CASES)}")
    for name in names:
        fn = CASES[name]()
        for _ in range(3):
            mx.eval(fn())
            mx.synchronize()
        print(name, "ran", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
