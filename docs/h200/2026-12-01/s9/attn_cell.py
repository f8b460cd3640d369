# The bench's two B = 1 decode cells (bi_rl.bench.kernels inputs, ops path) with the
# dispatcher's pick and with 1 and 16 splits a block forced, against stock, same process.
import mlx.core as mx

from bi_rl import _stock
from bi_rl.backends.cuda import attention as A
from bi_rl.bench.kernels import BF16, _attention, rand
from bi_rl.bench.timing import compare

s = 128**-0.5
for ctx in (32768, 131072):
    q = rand((1, 16, 1, 128), BF16, 5)
    k, v = rand((1, 8, ctx, 128), BF16, 6), rand((1, 8, ctx, 128), BF16, 7)
    mx.eval(q, k, v)
    stock = lambda q=q, k=k, v=v: _stock.scaled_dot_product_attention(q, k, v, scale=s)
    forced = lambda spb, q=q, k=k, v=v: A.scaled_dot_product_attention(
        q, k, v, s, config=A.AttnConfig(1, 2, True, spb)
    )
    print("dispatcher:", A.choose_config(1, 8, 2, ctx, 128), flush=True)
    for name, f in (
        ("bench ops path", lambda q=q, k=k, v=v: _attention(q, k, v, None, True)),
        ("spb1", lambda forced=forced: forced(1)),
        ("spb16", lambda forced=forced: forced(16)),
        ("default", lambda q=q, k=k, v=v: A.scaled_dot_product_attention(q, k, v, s)),
    ):
        a, b = compare(f, stock)
        print(
            f"B=1 keys={ctx} {name}: {a.median_s * 1e6:7.1f} us stock {b.median_s * 1e6:7.1f} "
            f"ratio {a.median_s / b.median_s:5.2f}",
            flush=True,
        )
