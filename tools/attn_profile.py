"""One launch each of our attention and stock's on the slow cases, for Nsight Compute.

    ncu --profile-from-start off --section SpeedOfLight --section Occupancy \
        --section LaunchStats --section WarpStateStats --section MemoryWorkloadAnalysis \
        python tools/attn_profile.py

Cases: decode of one query token a row at batch 64 over 32768 keys and causal prefill of 8192
tokens, both with Qwen3-1.7B's heads (16 query / 8 KV, head dim 128); `--case` keeps one.
The inputs are made and both kernels compiled before the profiler starts, so only the timed
launches are in range.
Needs MLX's CUDA backend and cuda-bindings.
"""

from __future__ import annotations

import argparse

import mlx.core as mx

from bi_rl import _stock, ops
from bi_rl.verify.core import rand

BF16 = mx.bfloat16
SCALE = 128**-0.5


def cases():
    q = rand((64, 16, 1, 128), BF16, 1)
    k, v = rand((64, 8, 32768, 128), BF16, 2), rand((64, 8, 32768, 128), BF16, 3)
    yield "decode B=64 keys=32768", q, k, v, None
    q, k, v = (rand((1, 16 if i == 0 else 8, 8192, 128), BF16, 4 + i) for i in range(3))
    yield "prefill 8192 causal", q, k, v, "causal"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--case", choices=("all", "decode", "prefill"), default="all")
    args = p.parse_args(argv)
    from cuda.bindings import runtime

    made = []
    for name, q, k, v, mask in cases():
        if args.case != "all" and not name.startswith(args.case):
            continue
        mx.eval(q, k, v)

        def ours(q=q, k=k, v=v, m=mask):
            return ops.scaled_dot_product_attention(q, k, v, SCALE, m)

        def stock(q=q, k=k, v=v, m=mask):
            return _stock.scaled_dot_product_attention(q, k, v, scale=SCALE, mask=m)

        mx.eval(ours(), stock())
        made.append((name, ours, stock))
    mx.synchronize()
    runtime.cudaProfilerStart()
    for name, ours, stock in made:
        print("profiling", name, flush=True)
        mx.eval(ours())
        mx.synchronize()
        mx.eval(stock())
        mx.synchronize()
    runtime.cudaProfilerStop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
