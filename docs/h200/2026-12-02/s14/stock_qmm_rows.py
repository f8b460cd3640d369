# Stock MLX's quantized matmul (4-bit, group 64) of R rows against a 151936 x 2048 weight (the
# 1.7B shape's tied head), for R around the rows rescoring at batch 64 hands the head: which R
# fails to launch (run f1: "off" rescoring at batch 64 failed, at 32 it ran).
import mlx.core as mx

w = mx.random.normal((151936, 2048)).astype(mx.bfloat16)
wq, s, b = mx.quantize(w, group_size=64, bits=4)
mx.eval(wq, s, b)
for r in (4096, 8192, 12288, 14000, 16383, 16384, 16385, 20000, 32768):
    x = mx.random.normal((r, 2048)).astype(mx.bfloat16)
    try:
        y = mx.quantized_matmul(x, wq, s, b, transpose=True, group_size=64, bits=4)
        mx.eval(y)
        print(f"R={r}: ok", flush=True)
    except RuntimeError as e:
        print(f"R={r}: {e}", flush=True)
    del x
