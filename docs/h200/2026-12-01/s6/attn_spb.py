# Decode attention at small batch over long contexts: every split configuration forced
# (speed only; the tests prove the bits equal), against stock, same process.
import mlx.core as mx

from bi_rl.backends.cuda import attention as A
from bi_rl.bench.timing import compare

for b in (1, 2, 8):
    for keys in (32768, 131072):
        q = mx.random.normal((b, 16, 1, 128)).astype(mx.bfloat16)
        k = mx.random.normal((b, 8, keys, 128)).astype(mx.bfloat16)
        v = mx.random.normal((b, 8, keys, 128)).astype(mx.bfloat16)
        mx.eval(q, k, v)
        stock = lambda q=q, k=k, v=v: mx.fast.scaled_dot_product_attention(q, k, v, scale=0.088)
        chosen = A.choose_config(b, 8, 2, keys, 128)
        for cfg in (
            A.AttnConfig(1, 2, False),
            A.AttnConfig(1, 2, True, 1),
            A.AttnConfig(1, 2, True, 4),
            A.AttnConfig(1, 2, True, 16),
            A.AttnConfig(1, 3, True, 4),
        ):
            ours = lambda cfg=cfg, q=q, k=k, v=v: A.scaled_dot_product_attention(
                q, k, v, 0.088, config=cfg
            )
            a, s = compare(ours, stock)
            mark = " (dispatcher's)" if cfg == chosen else ""
            print(
                f"B={b} keys={keys} {cfg}: {a.median_s * 1e6:8.1f} us  "
                f"stock {s.median_s * 1e6:8.1f} us  ratio {a.median_s / s.median_s:5.2f}{mark}",
                flush=True,
            )
