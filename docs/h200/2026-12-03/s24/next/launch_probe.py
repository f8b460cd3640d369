"""What one `mx.fast.cuda_kernel` call costs the host, and what in it: per call, graph building
alone (nothing evaluated) and building plus evaluation of 64 calls, medians of 15 samples.

The host probe of the twenty-fourth session found our calls building their graphs in 7.9-14.7
us against 0.7-1.1 us for stock's ops, and decode at batch 1 host-bound. The dispatcher's own
Python is about 1.4 us of that (tools/host_cost.py, stand-in kernels); the rest is MLX's
custom-kernel call, which per call converts its arguments, writes out the kernel's full
source text (header, one `constexpr` line per template argument, the signature, the body)
and names it, and at evaluation hashes that text to find the compiled module. This script
varies one thing at a time on a trivial copy kernel, so the next change can aim at the part
that costs:

- template arguments: 0, 4, 8 and 12 ints (our kernels pass 6-11);
- the header's length: 0, 4 and 16 KiB of comment lines (ours are about 300 bytes: the
  kernel files are #included);
- inputs: 1 and 4 arrays, and whether the source names `x_shape` / `x_strides` (each named
  one is a kernel argument MLX fills per call);
- beside them: stock `x + 1` (one elementwise node), and our real 4-bit M = 1 launch
  (`hopper_qmm` at 2048 x 2048) called three ways: through `quantized_matmul`, through its
  plan's `run`, and as its `Launch` alone, so the dispatcher's share is read off directly.

    PYTHONPATH=<tree> python3 -P docs/h200/2026-12-03/s24/next/launch_probe.py > launch.jsonl
"""

from __future__ import annotations

import statistics
import time

import mlx.core as mx
import orjson

INNER = 64
BODY = "  const int i = blockIdx.x * blockDim.x + threadIdx.x;\n  if (i < n) out[i] = x[i];\n"


def timed(fn, evaluate: bool) -> float:
    """Median microseconds per call over 15 samples of INNER calls."""
    mx.eval(fn())
    samples = []
    for _ in range(15):
        start = time.perf_counter()
        outs = [fn() for _ in range(INNER)]
        if evaluate:
            mx.eval(outs)
            mx.synchronize()
        samples.append((time.perf_counter() - start) / INNER)
        del outs
    return statistics.median(samples) * 1e6


def emit(case: str, fn) -> None:
    row = {"case": case, "build_us": round(timed(fn, False), 2)}
    row["total_us"] = round(timed(fn, True), 2)
    print(orjson.dumps(row).decode(), flush=True)


def copy_kernel(n_template: int, header_bytes: int, n_inputs: int, shapes: bool):
    names = ["x"] + [f"y{i}" for i in range(1, n_inputs)]
    head = (
        "  const int n = x_shape[0];\n  (void)x_strides;\n" if shapes else "  const int n = 4096;\n"
    )
    body = head + BODY
    header = "".join(f"// {'p' * 76}\n" for _ in range(header_bytes // 80))
    k = mx.fast.cuda_kernel(
        name=f"probe_t{n_template}_h{header_bytes}_i{n_inputs}_s{int(shapes)}",
        input_names=names,
        output_names=["out"],
        source=body,
        header=header,
    )
    template = [(f"P{i}", i + 1) for i in range(n_template)]
    ins = [mx.zeros((4096,), mx.float32) for _ in names]
    mx.eval(ins)

    def call():
        return k(
            inputs=ins,
            template=template,
            grid=(4096, 1, 1),
            threadgroup=(256, 1, 1),
            output_shapes=[(4096,)],
            output_dtypes=[mx.float32],
        )[0]

    return call


def main() -> None:
    x = mx.zeros((4096,), mx.float32)
    mx.eval(x)
    emit("stock x + 1", lambda: x + 1)
    for t in (0, 4, 8, 12):
        emit(f"copy, {t} template args", copy_kernel(t, 0, 1, False))
    for h in (4096, 16384):
        emit(f"copy, header {h} bytes", copy_kernel(0, h, 1, False))
    emit("copy, 4 inputs", copy_kernel(0, 0, 4, False))
    emit("copy, x_shape and x_strides named", copy_kernel(0, 0, 1, True))
    emit("copy, 8 template args, 4 inputs, shapes named", copy_kernel(8, 0, 4, True))

    from bi_rl.backends.cuda import hopper_qmm as Q
    from bi_rl.verify.core import rand

    wq, sc, bi = mx.quantize(rand((2048, 2048), mx.bfloat16, 3, 2048**-0.5), group_size=64, bits=4)
    xq = rand((1, 2048), mx.bfloat16, 4)
    mx.eval(wq, sc, bi, xq)
    plan = Q.plan(xq, wq, sc, bi, 64, 4)
    emit(
        "qmm 4-bit M=1 2048x2048: quantized_matmul",
        lambda: Q.quantized_matmul(xq, wq, sc, bi, 64, 4),
    )
    emit("qmm: plan.run", lambda: plan.run(xq, wq, sc, bi))
    emit("qmm: Launch alone", lambda: plan.launch(xq, wq, sc, bi))
    emit("stock mx.quantized_matmul", lambda: mx.quantized_matmul(xq, wq, sc, bi, True, 64, 4))


if __name__ == "__main__":
    main()
