"""Chained A/B: the wgmma prefill attention with one or two warpgroups a block at head dim 128
(Qwen3-1.7B heads: 16 query / 8 KV), causal, one sequence of T tokens; the same bits.
The thirty-seventh session's script with its bit comparison through bi_rl.verify.core.bits
(numpy has no bfloat16: the first version stopped there on the device)."""

import sys

import mlx.core as mx
import orjson

from bi_rl import _stock
from bi_rl.backends.cuda import hopper_attention as HA
from bi_rl.bench.kernels import Chain
from bi_rl.bench.timing import compare_many
from bi_rl.verify.core import bits, rand

SCALE = 128**-0.5


def cell(t: int) -> dict:
    q, k, v = (rand((1, h, t, 128), mx.bfloat16, s) for h, s in ((16, 1), (8, 2), (8, 3)))
    sides = {
        "x1": lambda x: HA.launch(x, k, v, SCALE, None, 1, 0, nwg=1),
        "x2": lambda x: HA.launch(x, k, v, SCALE, None, 1, 0, nwg=2),
        "stock": lambda x: _stock.sdpa(x, k, v, SCALE, mask="causal"),
    }
    a, b = sides["x1"](q), sides["x2"](q)
    mx.eval(a, b)
    same = bool((bits(a) == bits(b)).all())
    res = compare_many({n: Chain(f, q) for n, f in sides.items()})
    return {"T": t, "same_bits": same, **{n: r.median_s * 1e3 for n, r in res.items()}}


for t in sys.argv[1].split(","):
    print(orjson.dumps(cell(int(t))).decode())
