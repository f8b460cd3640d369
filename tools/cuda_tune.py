"""Time every tile configuration the CUDA backend may dispatch, beside stock MLX, on the device.

The dispatchers (`choose_config` in bi_rl/backends/cuda/{gemm,attention}.py) pick a
configuration per problem size for speed alone: every configuration computes each output
element with the same reduction sequence, which tests/test_cuda_*.py assert bitwise. This
script measures them so the choice rests on numbers, and checks again, per case, that all
configurations give the same bits. It also measures the per-call host cost of the kernel
source passed inline vs by #include (bi_rl/backends/cuda/_kernels.py).

    python tools/cuda_tune.py [--parts host,gemm,qmm,attn] [--json FILE]

Times are medians of alternating samples (bi_rl.bench.timing.compare) in microseconds per
call; "x" is ours / stock in the same comparison.
"""

from __future__ import annotations

import argparse
import json
import sys

import mlx.core as mx
import numpy as np

from bi_rl import _stock
from bi_rl.backends.cuda import _kernels, attention, gemm, qmm
from bi_rl.bench.kernels import rand_rows
from bi_rl.bench.timing import compare
from bi_rl.verify.core import bits, rand

BF16 = mx.bfloat16
SHAPES = ((4096, 4096), (896, 4864), (4864, 896), (896, 151936))


def gemm_configs(m: int) -> dict[str, gemm.GemmConfig]:
    """The candidates timed at M = m: skinny and two tile sizes up to 256, six tilings past."""
    if m > 256:
        return {
            f"tiled {bm}x{bn} {wm}x{wn} s{st}": gemm.GemmConfig(
                "tiled", bm=bm, bn=bn, wm=wm, wn=wn, stages=st
            )
            for bm, bn, wm, wn, st in (
                (64, 128, 2, 4, 4),
                (128, 128, 2, 4, 4),
                (128, 128, 4, 2, 4),
                (128, 128, 2, 4, 3),
                (128, 64, 4, 2, 4),
                (64, 256, 2, 4, 4),
            )
        }
    out = {}
    if m <= 64:
        mt = -(-m // 16)
        for nt in (1, 2):
            for wk in (1, 2, 4, 8):
                out[f"skinny mt={mt} nt={nt} wk={wk}"] = gemm.GemmConfig("skinny", mt, nt, wk)
    out["tiled 64x128"] = gemm.GemmConfig("tiled", bm=64, bn=128, wm=2, wn=4, stages=4)
    out["tiled 128x128"] = gemm.GemmConfig("tiled", bm=128, bn=128, wm=2, wn=4, stages=4)
    return out


def attn_configs() -> dict[str, attention.AttnConfig]:
    """One-warp decode configurations: sequential, and split with 1 to 32 consecutive splits
    a block (at 256 keys a split the dispatcher picks 1, 4 or 16, at 512 1, 2 or 8: see
    attention.splits_per_block_steps; the others are here to be measured)."""
    seq = {f"w=1 s={s} seq": attention.AttnConfig(1, s, False) for s in (2, 3)}
    split = {
        f"w=1 s={s} split spb={n}": attention.AttnConfig(1, s, True, n)
        for s, n in ((2, 1), (2, 2), (2, 4), (2, 8), (2, 16), (2, 32), (3, 16))
    }
    return seq | split


def cases(parts: set[str]):
    """(part, label, {config: fn}, stock fn, chosen config name or None)."""
    if "host" in parts:
        for k, n in ((256, 256), (896, 4864), (4096, 4096)):
            x, w = rand((1, k), BF16, 1), rand((n, k), BF16, 2, scale=k**-0.5)
            cfg = gemm.choose_config(BF16, 1, n, k)
            spec = gemm.kernel_spec(cfg.kind, False, cfg.shared_memory)
            inline = mx.fast.cuda_kernel(
                name=spec.name,
                input_names=list(spec.inputs),
                output_names=list(spec.outputs),
                source=spec.source,
                header=spec.header(inline=True),
                ensure_row_contiguous=False,
            )
            grid, group = cfg.grid(1, n)
            run_inline = _kernels.Launch(
                kernel=inline,
                template=gemm.template_args(BF16, cfg, False, 1.0, 1.0),
                grid=grid,
                group=group,
                out_shape=(1, n),
                out_dtype=BF16,
            )
            fns = {
                "include": lambda x=x, w=w: gemm.linear(x, w),
                "inline": lambda x=x, w=w, run=run_inline: run(x, w),
            }
            yield "host", f"M=1 K={k} N={n}", fns, lambda x=x, w=w: _stock.linear(x, w), None
    if "attn" in parts:
        # decode, one query token a row, Qwen3-1.7B's heads (16 query / 8 KV, head dim 128)
        hq, hkv, d = 16, 8, 128
        scale = d**-0.5
        for ctx in (8192, 32768, 131072):
            for b in (1, 2, 8, 64):
                q = rand((b, hq, 1, d), BF16, 7)
                k, v = rand_rows((b, hkv, ctx, d), BF16, 8), rand_rows((b, hkv, ctx, d), BF16, 9)
                fns = {
                    name: (
                        lambda q=q, k=k, v=v, c=c: attention.scaled_dot_product_attention(
                            q, k, v, scale, None, config=c
                        )
                    )
                    for name, c in attn_configs().items()
                }
                chosen = attention.choose_config(b, hkv, hq // hkv, ctx, d)
                pick = next((nm for nm, c in attn_configs().items() if c == chosen), None)
                stock = lambda q=q, k=k, v=v: _stock.scaled_dot_product_attention(  # noqa: E731
                    q, k, v, scale=scale
                )
                yield "attn", f"decode B={b} keys={ctx}", fns, stock, pick

    for part, ms in (("gemm", (16, 32, 64, 128, 256)), ("large", (1024, 4096))):
        if part not in parts:
            continue
        for k, n in SHAPES:
            w = rand((n, k), BF16, 3, scale=k**-0.5)
            for m in ms:
                x = rand((m, k), BF16, 4 + m)
                fns = {
                    name: (lambda x=x, w=w, c=c: gemm.gemm(x, w, b_kn=False, config=c))
                    for name, c in gemm_configs(m).items()
                }
                chosen = gemm.choose_config(BF16, m, n, k)
                pick = next((nm for nm, c in gemm_configs(m).items() if c == chosen), None)
                yield part, f"M={m} K={k} N={n}", fns, lambda x=x, w=w: _stock.linear(x, w), pick
    if "qmm" in parts:
        # stock's quantized kernels compile for tens of seconds per shape: two shapes only
        for k, n in ((4096, 4096), (896, 151936)):
            wq, sc, bi = mx.quantize(rand((n, k), BF16, 5, scale=k**-0.5), group_size=64, bits=4)
            for m in (16, 32, 64):
                x = rand((m, k), BF16, 6 + m)
                a = (wq, sc, bi, True, 64, 4, "affine")
                fns = {
                    name: (lambda x=x, a=a, c=c: qmm.quantized_matmul(x, *a, config=c))
                    for name, c in gemm_configs(m).items()
                    if not name.startswith("skinny") or "wk=8" in name or "wk=2" in name
                }
                chosen = gemm.choose_config(BF16, m, n, k)
                pick = next((nm for nm, c in gemm_configs(m).items() if c == chosen), None)
                stock = lambda x=x, a=a: _stock.quantized_matmul(x, *a)  # noqa: E731
                yield "qmm", f"4-bit M={m} K={k} N={n}", fns, stock, pick


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--parts", default="host,attn,gemm,qmm", help="also: large (M = 1024, 4096)")
    p.add_argument("--json")
    p.add_argument("--samples", type=int, default=5)
    args = p.parse_args(argv)
    print("mlx", mx.__version__, mx.default_device(), "include root:", _kernels.include_root())
    rows = []
    for part, label, fns, stock, pick in cases(set(args.parts.split(","))):
        ref = None
        for name, fn in fns.items():
            out = fn()
            mx.eval(out)
            b = bits(out)
            same = ref is None or np.array_equal(b, ref)
            ref = b if ref is None else ref
            ours, st = compare(fn, stock, samples=args.samples)
            row = {
                "part": part,
                "case": label,
                "config": name,
                "chosen": name == pick,
                "ours_us": ours.median_s * 1e6,
                "stock_us": st.median_s * 1e6,
                "spread": max(ours.spread, st.spread),
                "bits_equal_first": bool(same),
            }
            rows.append(row)
            ratio = row["ours_us"] / row["stock_us"]
            print(
                f"{part:5} {label:28} {name:24} {'*' if row['chosen'] else ' '} "
                f"{row['ours_us']:9.1f} {row['stock_us']:9.1f} x{ratio:5.2f}"
                f" spread {row['spread']:.2f} {'' if same else 'BITS DIFFER'}",
                flush=True,
            )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    print("\nbest per case (ours / stock), * = what choose_config picks now:")
    best: dict = {}
    for r in rows:
        key = (r["part"], r["case"])
        if key not in best or r["ours_us"] < best[key]["ours_us"]:
            best[key] = r
    for (part, label), r in best.items():
        cur = [x for x in rows if (x["part"], x["case"]) == (part, label) and x["chosen"]]
        cur_s = f"now x{cur[0]['ours_us'] / cur[0]['stock_us']:.2f}" if cur else "now -"
        ratio = r["ours_us"] / r["stock_us"]
        print(f"{part:5} {label:28} best {r['config']:24} x{ratio:5.2f} {cur_s}")
    differ = [r for r in rows if not r["bits_equal_first"]]
    print(f"configurations with different bits: {len(differ)}")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
