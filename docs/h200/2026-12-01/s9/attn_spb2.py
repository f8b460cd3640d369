# Decode attention at small grids: splits per block 1, 4, 16 forced (speed only; the tests
# prove every configuration gives the same bits), against stock, same process. Cells: the
# widths of Qwen3-1.7B / Llama 3 8B (8 KV heads, 2 or 4 query rows per KV head, D = 128) and
# Phi-3 mini (32 KV heads, 1 row each, D = 96), batch 1-8, 16384-131072 keys.
import json
import os

import mlx.core as mx

from bi_rl.backends.cuda import attention as A
from bi_rl.bench.timing import compare

cells = [
    (b, 8, 2, keys, 128) for b in (1, 2, 4, 8) for keys in (16384, 24576, 32768, 65536, 131072)
]
cells += [(b, 8, 4, keys, 128) for b in (1, 2) for keys in (32768, 131072)]
cells += [(b, 32, 1, keys, 96) for b in (1, 2) for keys in (16384, 32768, 65536)]
rows = []
for b, hkv, rp, keys, d in cells:
    q = mx.random.normal((b, hkv * rp, 1, d)).astype(mx.bfloat16)
    k = mx.random.normal((b, hkv, keys, d)).astype(mx.bfloat16)
    v = mx.random.normal((b, hkv, keys, d)).astype(mx.bfloat16)
    mx.eval(q, k, v)
    stock = lambda q=q, k=k, v=v: mx.fast.scaled_dot_product_attention(q, k, v, scale=0.088)
    chosen = A.choose_config(b, hkv, rp, keys, d)
    cfgs = [A.AttnConfig(1, 2, True, s) for s in (1, 4, 16)]
    if chosen not in cfgs:
        cfgs.append(chosen)
    for cfg in cfgs:
        ours = lambda cfg=cfg, q=q, k=k, v=v: A.scaled_dot_product_attention(
            q, k, v, 0.088, config=cfg
        )
        a, s = compare(ours, stock)
        r = dict(
            b=b,
            hkv=hkv,
            rows_per=rp,
            keys=keys,
            d=d,
            config=repr(cfg),
            ours_us=a.median_s * 1e6,
            stock_us=s.median_s * 1e6,
            ratio=a.median_s / s.median_s,
            dispatcher=cfg == chosen,
        )
        rows.append(r)
        print(
            f"B={b} hkv={hkv} rows={rp} keys={keys} d={d} "
            f"spb={cfg.splits_per_block} split={cfg.split}: "
            f"{r['ours_us']:8.1f} us stock {r['stock_us']:8.1f} ratio {r['ratio']:5.2f}"
            f"{' (dispatcher)' if r['dispatcher'] else ''}",
            flush=True,
        )
with open(os.path.join(os.environ["OUT"], "attn-spb2.json"), "w") as f:
    json.dump(rows, f, indent=1)
