# Stock MLX's 4-bit quantized matmul: the rows at which it fails to launch, for the 1.7B
# head (N = 151936) and for N = 6144 / 2048, K = 2048 (bisection on a fresh error each probe).
import mlx.core as mx


def runs(r: int, wq, s, b) -> bool:
    x = mx.random.normal((r, wq.shape[1] * 8)).astype(mx.bfloat16)
    try:
        mx.eval(mx.quantized_matmul(x, wq, s, b, transpose=True, group_size=64, bits=4))
        return True
    except RuntimeError:
        return False


for n in (151936, 6144, 2048):
    w = mx.random.normal((n, 2048)).astype(mx.bfloat16)
    wq, s, b = mx.quantize(w, group_size=64, bits=4)
    mx.eval(wq, s, b)
    probes = {r: runs(r, wq, s, b) for r in (1024, 8192, 14000, 16383, 24576, 32767, 32768, 65536)}
    print(f"N={n}:", " ".join(f"{r}:{'ok' if v else 'FAIL'}" for r, v in probes.items()))
    if not probes[16383]:
        lo, hi = 14000, 16383
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if runs(mid, wq, s, b) else (lo, mid)
        print(f"N={n}: first failing rows {hi}", flush=True)
    if not probes[24576] and probes[32768]:
        lo, hi = 24576, 32768
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if runs(mid, wq, s, b) else (mid, hi)
        print(f"N={n}: first running rows past the failures {hi}", flush=True)
