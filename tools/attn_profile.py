"""One launch each of our attention and stock's on the slow cases, for Nsight Compute.

    ncu --profile-from-start off --section SpeedOfLight --section Occupancy \
        --section LaunchStats --section WarpStateStats --section MemoryWorkloadAnalysis \
        python tools/attn_profile.py

Cases, all with Qwen3-1.7B's heads (16 query / 8 KV, head dim 128): decode of one query token
a row at batch 64 over 32768 keys (`decode`), decode of a single row over 32768 and 131072
keys (`decode1`), causal prefill of 8192 tokens (`prefill`), and prefill of 16384 tokens under
a 4096-key sliding window (`window`: ours through the kernel's window argument, stock through
the equivalent mask, as bi-bench times them); `--case` keeps one kind.
The inputs are made and both kernels compiled before the profiler starts, so only the timed
launches are in range.
Needs MLX's CUDA backend and cuda-bindings.
"""

from __future__ import annotations

import argparse

import mlx.core as mx

from bi_rl import _stock, ops
from bi_rl.backends.composed import window_mask
from bi_rl.verify.core import rand

BF16 = mx.bfloat16
SCALE = 128**-0.5


def cases():
    """(kind, name, q, k, v, mask, window) for each case; inputs are made lazily, one case at a
    time."""
    for kind, b, keys in (("decode", 64, 32768), ("decode1", 1, 32768), ("decode1", 1, 131072)):
        q = rand((b, 16, 1, 128), BF16, 1)
        k, v = rand((b, 8, keys, 128), BF16, 2), rand((b, 8, keys, 128), BF16, 3)
        yield kind, f"decode B={b} keys={keys}", q, k, v, None, None
    q, k, v = (rand((1, 16 if i == 0 else 8, 8192, 128), BF16, 4 + i) for i in range(3))
    yield "prefill", "prefill 8192 causal", q, k, v, "causal", None
    q, k, v = (rand((1, 16 if i == 0 else 8, 16384, 128), BF16, 7 + i) for i in range(3))
    yield "window", "prefill 16384 window 4096", q, k, v, None, 4096


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--case", choices=("all", "decode", "decode1", "prefill", "window"), default="all"
    )
    args = p.parse_args(argv)
    from cuda.bindings import runtime

    made = []
    for kind, name, q, k, v, mask, window in cases():
        if args.case not in ("all", kind):
            continue
        mx.eval(q, k, v)
        # a sliding window: the kernel's argument for ours, the equivalent mask for stock
        stock_mask = mask if window is None else window_mask(q.shape[2], k.shape[2], window)

        def ours(q=q, k=k, v=v, m=mask, w=window):
            return ops.scaled_dot_product_attention(q, k, v, SCALE, m, window=w)

        def stock(q=q, k=k, v=v, m=stock_mask):
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
