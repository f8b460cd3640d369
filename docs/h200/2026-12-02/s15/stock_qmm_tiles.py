# Which of stock MLX's quantized matmul kernels compile on this install: one 4-bit (group 64)
# quantized_matmul per (rows, K, N), a fresh process's first use of each tile width MLX picks
# from the rows (16 / 32 / 64 / 128 / 256 on sm_90), as (rows, K) and as (batch, 1, K).
# A kernel that fails to compile prints the first line of MLX's error.
import mlx.core as mx

for k, n in ((64, 64), (64, 151936), (2048, 2048)):
    w, s, b = mx.quantize(mx.random.normal((n, k)).astype(mx.bfloat16), group_size=64, bits=4)
    for shape in ((1, k), (16, k), (17, k), (33, k), (64, k), (65, k), (200, k), (64, 1, k)):
        x = mx.random.normal(shape).astype(mx.bfloat16)
        try:
            mx.eval(mx.quantized_matmul(x, w, s, b, group_size=64, bits=4))
            print(f"K={k} N={n} x={shape}: ok", flush=True)
        except RuntimeError as e:
            print(f"K={k} N={n} x={shape}: {str(e).splitlines()[0][:160]}", flush=True)
