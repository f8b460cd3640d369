"""Chained A/B of the wgmma prefill attention's schedules on a Hopper GPU: two warpgroups a
block in lockstep against two in ping-pong (hopper_attention.pingpong), the same with its K/V
copied by TMA (hopper_attention.tma_copies), one warpgroup a block, and stock MLX's
attention, causal, B sequences of T tokens, Qwen3-1.7B's heads (16 query / 8 KV), the
schedules' output bits compared (they must be equal: speed is all a schedule may change).
Each side runs as a chain of calls in one process, the sides alternating
(bi_rl.bench.timing.compare_many); one JSON line a cell: median ms a call and the bits check.

    python tools/attn_schedule_ab.py --tokens 512,2048,8192 --batch 1 --head-dim 128
"""

from __future__ import annotations

import argparse

import mlx.core as mx
import orjson

from bi_rl import _stock
from bi_rl.backends.cuda import hopper_attention as HA
from bi_rl.bench.kernels import Chain
from bi_rl.bench.timing import compare_many
from bi_rl.verify.core import bits, rand

CAUSAL = 1  # attention.CAUSAL


def cell(b: int, t: int, d: int) -> dict:
    q, k, v = (rand((b, h, t, d), mx.bfloat16, s) for h, s in ((16, 1), (8, 2), (8, 3)))
    scale = d**-0.5
    sides = {
        "lockstep": lambda x: HA.launch(x, k, v, scale, None, CAUSAL, 0, nwg=2, pp=False),
        "pingpong": lambda x: HA.launch(x, k, v, scale, None, CAUSAL, 0, nwg=2, pp=True, tma=False),
        "pingpong_tma": lambda x: HA.launch(
            x, k, v, scale, None, CAUSAL, 0, nwg=2, pp=True, tma=True
        ),
        "x1": lambda x: HA.launch(x, k, v, scale, None, CAUSAL, 0, nwg=1, pp=False),
        "stock": lambda x: _stock.sdpa(x, k, v, scale, mask="causal"),
    }
    outs = {n: sides[n](q) for n in ("lockstep", "pingpong", "pingpong_tma", "x1")}
    if any(o is None for o in outs.values()):
        raise SystemExit("the wgmma kernel did not run (no Hopper GPU or no kernel cache)")
    mx.eval(*outs.values())
    same = all(
        bool((bits(outs[n]) == bits(outs["lockstep"])).all())
        for n in ("pingpong", "pingpong_tma", "x1")
    )
    res = compare_many({n: Chain(f, q) for n, f in sides.items()})
    ms = {n: r.median_s * 1e3 for n, r in res.items()}
    return {
        "B": b,
        "T": t,
        "D": d,
        "same_bits": same,
        **ms,
        "pingpong/lockstep": ms["pingpong"] / ms["lockstep"],
        "pingpong_tma/pingpong": ms["pingpong_tma"] / ms["pingpong"],
        "pingpong/stock": ms["pingpong"] / ms["stock"],
        "lockstep/stock": ms["lockstep"] / ms["stock"],
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", default="512,2048,8192", help="comma-separated T")
    ap.add_argument("--batch", default="1", help="comma-separated B")
    ap.add_argument("--head-dim", default="128", help="comma-separated head dims (64, 128)")
    args = ap.parse_args(argv)
    for d in (int(x) for x in args.head_dim.split(",")):
        for b in (int(x) for x in args.batch.split(",")):
            for t in (int(x) for x in args.tokens.split(",")):
                print(orjson.dumps(cell(b, t, d)).decode(), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
