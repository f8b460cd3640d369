"""Check and time the Hopper (wgmma) GEMM and quantized GEMM on the device, beside stock MLX.

    python tools/hopper_check.py check    bits: every configuration, row subsets, operand
                                          forms; accuracy vs float64 (dense)
    python tools/hopper_check.py qcheck   the same for quantized matmul (every bit width and
                                          group size, K tails, float32 activations)
    python tools/hopper_check.py tune     every dense configuration timed on model shapes
    python tools/hopper_check.py midtune  dense candidates at 128-2048 rows (prefill, rescoring)
    python tools/hopper_check.py qtune    the same for 4- and 8-bit weights
    python tools/hopper_check.py host     host cost per call of each launch path (tiny GEMMs)
    python tools/hopper_check.py profile  one launch per case, for Nsight Compute
    python tools/hopper_check.py qprofile the same for 4-bit quantized GEMMs at decode sizes
    python tools/hopper_check.py qsweep   small-M quantized candidates and stock, one cold launch
                                          each, for ncu (see qsweep's docstring)
    (--json F writes every row)

Needs MLX's CUDA backend on a Hopper GPU and cuda-bindings (NVRTC). Each check prints one line;
the last lines are a summary. Weights are rotated among copies larger than the L2 cache when
timing small M, so memory-bound cases stream from HBM as a model's layers do.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import os
import statistics
import sys
import time
import traceback
from concurrent.futures import ThreadPoolExecutor

import mlx.core as mx
import numpy as np

from bi_rl.backends.cuda import hopper, hopper_qmm, mlx_jit
from bi_rl.backends.cuda.gemm import GemmConfig
from bi_rl.backends.cuda.gemm import gemm as cuda_gemm
from bi_rl.backends.cuda.qmm import quantized_matmul as cuda_qmm
from bi_rl.verify.core import f64

BF16, F16 = mx.bfloat16, mx.float16
QWEN3_17B = ((2048, 2048), (2048, 6144), (6144, 2048), (2048, 151936))
LLAMA3_8B = ((4096, 4096), (4096, 14336), (14336, 4096), (4096, 128256))


def rand(shape, dtype, seed, scale=1.0):
    return (mx.random.normal(shape, key=mx.random.key(seed)) * scale).astype(dtype)


def bits(x) -> np.ndarray:
    return np.array(x.view(mx.uint16)) if x.dtype in (BF16, F16) else np.array(x)


def rel_err(out, ref) -> float:
    o = f64(out)
    return float(np.linalg.norm(o - ref) / max(np.linalg.norm(ref), 1e-30))


def warm(cases) -> None:
    """Compile every (dtype, config, has_c) the checks use, in parallel threads."""
    jobs = set(cases)
    t = time.perf_counter()
    with ThreadPoolExecutor(8) as ex:
        list(ex.map(lambda j: hopper.prepare(*j, 1.0, 1.0), jobs))
    print(f"compiled/loaded {len(jobs)} kernels in {time.perf_counter() - t:.1f} s", flush=True)


class Results:
    def __init__(self):
        self.rows, self.failed = [], 0

    def add(self, name: str, ok: bool, **info) -> None:
        self.rows.append({"check": name, "ok": bool(ok), **info})
        self.failed += not ok
        extra = " ".join(f"{k}={v}" for k, v in info.items())
        print(f"{'ok  ' if ok else 'FAIL'} {name} {extra}", flush=True)


def mlx_rendering(kern, **call) -> str:
    """The translation unit MLX builds for a cuda_kernel call (printed with verbose=True)."""
    import os
    import tempfile

    sys.stdout.flush()
    saved = os.dup(1)
    with tempfile.TemporaryFile(mode="w+b") as tmp:
        os.dup2(tmp.fileno(), 1)
        try:
            kern(**call, verbose=True)
        finally:
            sys.stdout.flush()
            os.dup2(saved, 1)
            os.close(saved)
        tmp.seek(0)
        text = tmp.read().decode()
    body = text.split("```\n", 1)[1]
    return body[: body.rindex("\n```")]


def render_check(res: Results) -> None:
    """bi-rl's copy of MLX's source builder must give MLX's bytes (they name the cache entry)."""
    # with and without c, and a second output of another type: the TMA kernel's uint32 maps
    for cfg, has_c in ((hopper.configs()[0], False), (hopper.configs()[0], True),
                       (hopper.PREFILL_TMA, False)):  # fmt: skip
        sp = hopper.cfg_spec(cfg, has_c)
        t = hopper.template(BF16, cfg, has_c, 1.0, 1.0)
        ins = [rand((4, 8), BF16, i) for i in range(len(sp.inputs))]
        outs = list(hopper.out_dtypes(cfg, BF16))
        shapes = [(4, 4)] + ([(cfg.scratch_words(4, 4),)] if cfg.tma else [])
        mlx = mlx_rendering(
            hopper.kernel(sp),
            inputs=ins,
            template=t,
            grid=(cfg.threads, 1, 1),
            threadgroup=(cfg.threads, 1, 1),
            output_shapes=shapes,
            output_dtypes=outs,
        )
        ours = mlx_jit.render(sp, sp.header(), [(BF16, 2)] * len(ins), outs, t)
        what = f"c={has_c}" + (", TMA, uint32 maps" if cfg.tma else "")
        res.add(f"MLX renders the source bi-rl hashes ({what})", mlx == ours)
    print("MLX cache dir:", mlx_jit.cache_dir(), flush=True)


def check(res: Results) -> None:
    render_check(res)
    cfgs = hopper.variants()
    shapes = [(64, 64), (72, 40), (100, 37), (136, 264), (2048, 2048), (6144, 2048), (2048, 6144)]
    ms_all = (1, 7, 8, 9, 63, 64, 65, 127, 128, 129, 255, 256, 257, 300)
    warm([(dt, c, hc) for dt in (BF16, F16) for c in cfgs for hc in (False, True)])
    for dt in (BF16, F16):
        for k, n in shapes:
            w = rand((n, k), dt, 1, k**-0.5)
            mmax = 300
            a = rand((mmax, k), dt, 2)
            full = {}
            for cfg in cfgs:
                out = hopper.gemm(a, w, b_kn=False, config=cfg, poison=float("nan"))
                mx.eval(out)
                full[cfg] = bits(out)
            ref = f64(a) @ f64(w).T
            base = full[cfgs[0]]
            same = all(np.array_equal(base, v) for v in full.values())
            written = not np.isnan(f64(hopper.gemm(a, w, b_kn=False, poison=float("nan")))).any()
            err = rel_err(hopper.gemm(a, w, b_kn=False), ref)
            res.add(
                f"configs {dt} K={k} N={n}",
                same and written,
                rel_err=f"{err:.2e}",
                configs=len(cfgs),
            )
            res.add(f"accuracy {dt} K={k} N={n}", err < 8e-3, rel_err=f"{err:.2e}")
            bad = []
            for m in ms_all:
                for off in (0, 5):
                    if off + m > mmax:
                        continue
                    out = bits(hopper.gemm(a[off : off + m], w, b_kn=False))
                    if not np.array_equal(out, base[off : off + m]):
                        bad.append((m, off))
            res.add(f"rows alone vs batch {dt} K={k} N={n}", not bad, differing=bad[:6])
            # stock control: the same comparison must be able to fail
            st_full = bits(a @ w.T)
            st_bad = sum(
                not np.array_equal(bits(a[:m] @ w.T), st_full[:m]) for m in ms_all if m <= mmax
            )
            res.add(f"stock control {dt} K={k} N={n}", True, stock_sizes_differing=st_bad)
    # operand forms on one shape: W.T view (matmul), a (K, N) row-major b, bias, addmm, 3-D a
    k, n = 256, 200
    for dt in (BF16, F16):
        w = rand((n, k), dt, 3, k**-0.5)
        a = rand((2, 70, k), dt, 4)
        bias = rand((n,), dt, 5)
        c_full = rand((2, 70, n), dt, 6)
        c_col = rand((140, 1), dt, 7)
        a2 = a.reshape(140, k)
        ref = f64(a2) @ f64(w).T
        lin = hopper.gemm(a, w, b_kn=False).reshape(140, n)
        mm = hopper.gemm(a2, w.T, b_kn=True)
        wkn = mx.contiguous(w.T)  # a genuinely (K, N) row-major right operand
        mm2 = hopper.gemm(a2, wkn, b_kn=True)
        res.add(
            f"forms linear==matmul(W.T)==matmul(KxN) {dt}",
            np.array_equal(bits(lin), bits(mm)) and np.array_equal(bits(mm), bits(mm2)),
            rel_err=f"{rel_err(lin, ref):.2e}",
        )
        withb = hopper.gemm(a2, w, b_kn=False, c=bias)
        refb = ref + f64(bias)[None, :]
        rows = all(
            np.array_equal(
                bits(hopper.gemm(a2[i : i + 1], w, b_kn=False, c=bias)), bits(withb)[i : i + 1]
            )
            for i in (0, 63, 64, 139)
        )
        res.add(
            f"bias {dt}",
            rows and rel_err(withb, refb) < 8e-3,
            rel_err=f"{rel_err(withb, refb):.2e}",
        )
        am = hopper.gemm(a, w.T, b_kn=True, c=c_full, alpha=0.5, beta=2.0).reshape(140, n)
        refam = 0.5 * ref + 2.0 * f64(c_full.reshape(140, n))
        res.add(
            f"addmm full c alpha beta {dt}",
            rel_err(am, refam) < 8e-3,
            rel_err=f"{rel_err(am, refam):.2e}",
        )
        ac = hopper.gemm(a2, w.T, b_kn=True, c=c_col)
        refc = ref + f64(c_col)
        res.add(
            f"addmm column c {dt}", rel_err(ac, refc) < 8e-3, rel_err=f"{rel_err(ac, refc):.2e}"
        )
        # a misaligned row-contiguous view: the element-wise loader gives the same bits
        flat = rand((140 * k + 1,), dt, 8)
        mis = flat[1:].reshape(140, k)
        al = mx.contiguous(mis)
        mx.eval(mis, al)
        res.add(
            f"misaligned operand {dt}",
            np.array_equal(
                bits(hopper.gemm(mis, w, b_kn=False)), bits(hopper.gemm(al, w, b_kn=False))
            ),
        )


def timed(fn, samples=9, min_s=0.01, max_inner=200) -> float:
    fn_out = fn()
    mx.eval(fn_out)
    mx.synchronize()

    def sample(inner):
        t = time.perf_counter()
        outs = [fn() for _ in range(inner)]
        mx.eval(outs)
        mx.synchronize()
        return (time.perf_counter() - t) / inner

    inner = 1
    while inner < max_inner and sample(inner) * inner < min_s:
        inner *= 2
    return statistics.median(sample(inner) for _ in range(samples))


def time_configs(a, pick, cfgs) -> dict:
    """Seconds per call of hopper.gemm(a, W.T) for each configuration (W from `pick`), those
    that cannot run reported and left out."""
    times = {}
    for cfg in cfgs:
        try:
            times[cfg] = timed(lambda c=cfg: hopper.gemm(a, pick(), b_kn=False, config=c))
        except Exception as e:  # noqa: BLE001 - a config that cannot run is reported
            print(f"  {cfg}: {type(e).__name__}: {e}", flush=True)
    return times


def tune(res: Results, only_chosen: bool = False) -> None:
    ms = (1, 8, 64, 512, 4096, 16384)
    cands = hopper.configs()
    for k, n in QWEN3_17B + LLAMA3_8B:
        nbytes = n * k * 2
        copies = max(1, min(8, -(-240_000_000 // nbytes)))
        ws = [rand((n, k), BF16, 10 + i, k**-0.5) for i in range(copies)]
        mx.eval(ws)
        for m in ms:
            if m * n > 16384 * 16384 and m > 4096:
                continue  # the 16k-row logits GEMM: seconds per sample
            a = rand((m, k), BF16, 3)
            pick = itertools.cycle(ws).__next__
            flops = 2 * m * n * k
            t_stock = timed(lambda a=a, pick=pick: a @ pick().T)
            chosen = hopper.choose_config(m, n, k)
            row = {"M": m, "K": k, "N": n, "stock_us": t_stock * 1e6, "chosen": str(chosen)}
            # up to 64 rows the one-warpgroup and few-row (mma.sync) kernels, past that wgmma
            wide = [c for c in cands if not c.narrow]
            fits = [c for c in cands if c.narrow or c.nwg == 1] if m <= 64 else wide
            times = time_configs(
                a, pick, [chosen] if only_chosen else dict.fromkeys([chosen, *fits])
            )
            row.update({str(cfg): t * 1e6 for cfg, t in times.items()})
            best = min(times.items(), key=lambda ct: ct[1]) if times else None
            t_ch = row.get(str(chosen))  # microseconds
            res.add(
                f"time M={m} K={k} N={n}",
                True,
                stock_us=f"{t_stock * 1e6:.1f}",
                chosen_us=f"{t_ch:.1f}" if t_ch else "-",
                ratio=f"{t_ch / (t_stock * 1e6):.2f}" if t_ch else "-",
                best=f"{best[0].bn}x{getattr(best[0], 'nwg', 'mma')}x{best[0].stages}"
                f":{best[1] * 1e6:.1f}"
                if best
                else "-",
                tflops=f"{flops / t_ch / 1e6:.0f}" if t_ch else "-",
                tbps=f"{(nbytes + m * k * 2 + m * n * 2) / t_ch / 1e6:.2f}" if t_ch else "-",
            )
            res.rows[-1].update(row)


def midtune(res: Results) -> None:
    """Prefill- and rescoring-sized M (128-2048 rows): every configuration with 64-row
    warpgroup tiles and one k-tile a stage (`hopper.variants()`) against stock, which chose the
    dispatch past 64 rows. One row per (M, K, N) with each candidate's time in microseconds."""
    cands = [c for c in hopper.variants() if c.rt >= 64 and c.kt == 1]
    for k, n in QWEN3_17B + LLAMA3_8B:
        ws = [rand((n, k), BF16, 10 + i, k**-0.5) for i in range(2)]
        mx.eval(ws)
        for m in (128, 256, 512, 1024, 2048):
            a = rand((m, k), BF16, 3)
            pick = itertools.cycle(ws).__next__
            t_stock = timed(lambda a=a, pick=pick: a @ pick().T) * 1e6
            chosen = hopper.choose_config(m, n, k)
            times = {  # microseconds by "rows x columns x stages"
                f"{cfg.rt}x{cfg.bn}x{cfg.stages}": t * 1e6
                for cfg, t in time_configs(a, pick, dict.fromkeys([chosen, *cands])).items()
            }
            best = min(times, key=times.get)
            ch = f"{chosen.rt}x{chosen.bn}x{chosen.stages}"
            res.add(
                f"mid M={m} K={k} N={n}",
                True,
                stock_us=f"{t_stock:.1f}",
                chosen=f"{ch}:{times[ch]:.1f}:{times[ch] / t_stock:.2f}",
                best=f"{best}:{times[best]:.1f}:{times[best] / t_stock:.2f}",
            )
            res.rows[-1].update(M=m, K=k, N=n, stock_us=t_stock, chosen=str(chosen), **times)


def quantize(n, k, dt, bits, gs, seed):
    w = rand((n, k), dt, seed, k**-0.5)
    wq, sc, bi = mx.quantize(w, group_size=gs, bits=bits)
    return wq, sc, bi, mx.dequantize(wq, sc, bi, group_size=gs, bits=bits)


def qcheck(res: Results) -> None:
    dt = BF16
    warm_q = [(dt, c) for b in hopper_qmm.BITS for c in hopper_qmm.variants(b)]
    t = time.perf_counter()
    with ThreadPoolExecutor(8) as ex:
        list(ex.map(lambda j: hopper_qmm.prepare(*j), warm_q))
    print(f"prepared {len(warm_q)} qmm kernels in {time.perf_counter() - t:.1f} s", flush=True)
    ms = (1, 7, 8, 9, 63, 64, 65, 128, 129, 257, 300)
    for nb in hopper_qmm.BITS:
        for gs in (32, 64, 128):
            for k, n in ((256, 72), (160 if gs == 32 else 384, 40), (2048, 512)):
                if k % gs:
                    continue
                wq, sc, bi, wd = quantize(n, k, dt, nb, gs, 11)
                a = rand((300, k), dt, 12)
                outs = {}
                for cfg in hopper_qmm.variants(nb):
                    o = hopper_qmm.quantized_matmul(
                        a, wq, sc, bi, gs, nb, config=cfg, poison=float("nan")
                    )
                    outs[cfg] = bits(o)
                base = next(iter(outs.values()))
                same = all(np.array_equal(base, v) for v in outs.values())
                written = not np.isnan(
                    f64(hopper_qmm.quantized_matmul(a, wq, sc, bi, gs, nb, poison=float("nan")))
                ).any()
                ref = f64(a) @ f64(wd).T
                err = rel_err(cuda_qmm(a, wq, sc, bi, True, gs, nb), ref)
                # stock MLX compiles a kernel per shape on a fresh machine: compare once per width
                err_stock = (
                    rel_err(mx.quantized_matmul(a, wq, sc, bi, True, gs, nb), ref)
                    if (k, gs) == (2048, 64)
                    else 4e-3
                )
                bad = [
                    m
                    for m in ms
                    if not np.array_equal(bits(cuda_qmm(a[:m], wq, sc, bi, True, gs, nb)), base[:m])
                ]
                res.add(
                    f"qmm {nb}-bit g{gs} K={k} N={n}",
                    same and written and not bad and err < 1.2 * err_stock + 1e-3,
                    rel_err=f"{err:.2e}",
                    stock_err=f"{err_stock:.2e}",
                    differing=bad[:5],
                    configs=len(outs),
                )
    # float32 activations: dequantised weight on the float32 GEMM
    for nb in (4, 8):
        w = rand((96, 256), mx.float32, 13, 256**-0.5)
        wq, sc, bi = mx.quantize(w, group_size=64, bits=nb)
        a = rand((70, 256), mx.float32, 14)
        full = np.array(cuda_qmm(a, wq, sc, bi, True, 64, nb))
        rows = all(
            np.array_equal(
                np.array(cuda_qmm(a[i : i + 1], wq, sc, bi, True, 64, nb)), full[i : i + 1]
            )
            for i in (0, 7, 8, 69)
        )
        ref = f64(a) @ f64(mx.dequantize(wq, sc, bi, group_size=64, bits=nb)).T
        res.add(
            f"qmm float32 {nb}-bit",
            rows and rel_err(mx.array(full), ref) < 1e-5,
            rel_err=f"{rel_err(mx.array(full), ref):.2e}",
        )


def qtune(res: Results) -> None:
    ms = (1, 8, 64, 512, 4096)
    for nb in (4, 8):
        for k, n in QWEN3_17B + LLAMA3_8B[:3]:
            copies = max(1, min(8, -(-240_000_000 // (n * k * nb // 8))))
            qs = [quantize(n, k, BF16, nb, 64, 20 + i)[:3] for i in range(copies)]
            mx.eval(qs)
            for m in ms:
                a = rand((m, k), BF16, 3)
                pick = itertools.cycle(qs).__next__
                t_stock = timed(lambda a=a, p=pick, b=nb: mx.quantized_matmul(a, *p(), True, 64, b))
                t_ours = timed(lambda a=a, p=pick, b=nb: cuda_qmm(a, *p(), True, 64, b))
                res.add(
                    f"qtime {nb}-bit M={m} K={k} N={n}",
                    True,
                    stock_us=f"{t_stock * 1e6:.1f}",
                    ours_us=f"{t_ours * 1e6:.1f}",
                    ratio=f"{t_ours / t_stock:.2f}",
                    chosen=str(hopper_qmm.choose_config(m, n, k, nb)),
                )


def host(res: Results) -> None:
    """Per-call cost of a chain of tiny launches: host-bound, so it measures the launch path."""
    a, w = rand((1, 256), BF16, 1), rand((256, 256), BF16, 2)
    cfg = hopper.choose_config(1, 256, 256)
    pre = hopper._plan(a, w, False, None, 1.0, 1.0, cfg)
    pre = dataclasses.replace(pre, launch=None, cubin=hopper.precompiled_cubin(BF16, cfg, False))
    paths = {
        "stock": lambda: a @ w.T,
        "hopper (MLX cuda_kernel, cubin in its cache)": lambda: hopper.gemm(a, w, b_kn=False),
        "hopper (precompiled_cuda_kernel)": lambda: hopper._precompiled(
            pre, a, w, None, 1.0, 1.0, None
        ),
        "mma.sync (cuda_kernel, NVRTC sm_90)": lambda: cuda_gemm(
            a, w, b_kn=False, config=GemmConfig("skinny", mt=1, nt=2, wk=1)
        ),
    }
    for name, fn in paths.items():
        mx.eval(fn())
        for _ in range(3):
            t = time.perf_counter()
            outs = [fn() for _ in range(400)]
            mx.eval(outs)
            mx.synchronize()
            us = (time.perf_counter() - t) / 400 * 1e6
        res.add(f"host {name}", True, us_per_call=f"{us:.1f}")


def profile(res: Results) -> None:
    """One launch each of a compute-bound and a memory-bound case, for Nsight Compute."""
    for m, k, n in ((4096, 4096, 4096), (1, 2048, 6144), (64, 2048, 151936)):
        a, w = rand((m, k), BF16, 1), rand((n, k), BF16, 2, k**-0.5)
        mx.eval(hopper.gemm(a, w, b_kn=False), a @ w.T)
        mx.synchronize()
        res.add(f"profiled M={m} K={k} N={n}", True, config=str(hopper.choose_config(m, n, k)))


def qprofile(res: Results) -> None:
    """One launch each of 4-bit quantized GEMMs at decode sizes (ours, then stock's), for ncu."""
    for m, k, n in ((1, 2048, 6144), (8, 2048, 6144), (64, 2048, 6144)):
        a = rand((m, k), BF16, 1)
        wq, sc, bi = quantize(n, k, BF16, 4, 64, 2)[:3]
        mx.eval(a, wq, sc, bi)
        mx.eval(cuda_qmm(a, wq, sc, bi, True, 64, 4))
        mx.synchronize()
        mx.eval(mx.quantized_matmul(a, wq, sc, bi, True, 64, 4))
        mx.synchronize()
        cfg = hopper_qmm.choose_config(m, n, k, 4)
        res.add(f"qprofiled M={m} K={k} N={n}", True, config=str(cfg))


SWEEP_MS = (1, 8, 64)
SWEEP_BITS = tuple(int(b) for b in os.environ.get("QSWEEP_BITS", "4,8").split(","))


def small_m_candidates(m: int, bits: int) -> list:
    """Quantized configurations worth timing at a decode-sized M: the row tile that fits M,
    narrow to wide columns."""
    rt = hopper_qmm.row_tile(m)
    out = []
    for bn in (16, 32, 64, 128):
        c = hopper_qmm.qconfig(bn, 1, bits, rt, 1, hopper_qmm.DECODE_STAGES)
        if c.shared_memory <= hopper.MAX_SHARED:
            out.append(c)
    return out + [c for c in hopper_qmm.decode_kt_variants(bits) if c.rt == rt]


def qsweep(res: Results) -> None:
    """Every small-M candidate and stock's kernel, one cold launch each (twice), inside a
    cudaProfilerStart range, for `ncu --profile-from-start off --cache-control all`; the launch
    order goes to qsweep-plan.json for `qsweep_report`."""
    from cuda.bindings import runtime

    cases, plan = [], []
    for nb in SWEEP_BITS:
        for k, n in QWEN3_17B + LLAMA3_8B[1:3]:
            w = quantize(n, k, BF16, nb, 64, 20)[:3]
            for m in SWEEP_MS:
                a = rand((m, k), BF16, 3)
                cands = small_m_candidates(m, nb)
                chosen = hopper_qmm.choose_config(m, n, k, nb)
                cands += [chosen] if chosen not in cands else []
                mx.eval(a, *w, *[cuda_qmm(a, *w, True, 64, nb, config=c) for c in cands])
                mx.eval(mx.quantized_matmul(a, *w, True, 64, nb))
                cases.append((nb, k, n, m, a, w, cands, chosen))
    mx.synchronize()
    runtime.cudaProfilerStart()
    for nb, k, n, m, a, w, cands, chosen in cases:
        for c in cands:
            for _ in range(2):
                mx.eval(cuda_qmm(a, *w, True, 64, nb, config=c))
                mx.synchronize()
            plan.append(
                {
                    "bits": nb,
                    "k": k,
                    "n": n,
                    "m": m,
                    "config": str(c),
                    "chosen": c == chosen,
                    "name": mlx_jit.kernel_name(
                        hopper_qmm.cfg_spec(c).name,
                        hopper_qmm.template(BF16, c),
                    ),
                }
            )
        for _ in range(2):
            mx.eval(mx.quantized_matmul(a, *w, True, 64, nb))
            mx.synchronize()
        plan.append({"bits": nb, "k": k, "n": n, "m": m, "config": "stock", "name": None})
    runtime.cudaProfilerStop()
    with open("qsweep-plan.json", "w") as f:
        json.dump(plan, f)
    res.add("qsweep launches", True, cases=len(cases), entries=len(plan))


def qsweep_report(csv_path: str, plan_path: str) -> list[dict]:
    """Pair ncu's kernel durations (CSV, launch order) with the qsweep plan: each of our
    entries is two launches of its kernel; a stock entry is every other kernel until the next
    of ours, halved (two calls)."""
    import csv

    with open(csv_path) as f:
        rows = [
            r
            for r in csv.DictReader(line for line in f if not line.startswith("=="))
            if r.get("Metric Name") == "gpu__time_duration.sum"
        ]
    kern = [(r["Kernel Name"], float(r["Metric Value"].replace(",", ""))) for r in rows]
    with open(plan_path) as f:
        plan = json.load(f)
    out, i = [], 0
    for e in plan:
        if e["name"]:
            ts = []
            while len(ts) < 2:
                name, t = kern[i]
                i += 1
                if e["name"] in name:
                    ts.append(t)
            out.append({**e, "us": min(ts) / 1000})
        else:
            ts = []
            while i < len(kern) and "bi_hopper_qmm" not in kern[i][0]:
                ts.append(kern[i][1])
                i += 1
            out.append({**e, "us": sum(ts) / 2000})
    return out


def print_qsweep(rows: list[dict]) -> None:
    """Per case: stock, the dispatcher's choice and the fastest candidate, in microseconds."""
    cases: dict = {}
    for r in rows:
        cases.setdefault((r["bits"], r["k"], r["n"], r["m"]), []).append(r)
    print("bits K N M | stock us | chosen us ratio | best us ratio config")
    for (nb, k, n, m), rs in cases.items():
        stock = next(r["us"] for r in rs if r["config"] == "stock")
        ours = [r for r in rs if r["config"] != "stock"]
        ch = next(r for r in ours if r["chosen"])
        best = min(ours, key=lambda r: r["us"])
        print(
            f"{nb} {k} {n} {m} | {stock:.1f} | {ch['us']:.1f} {ch['us'] / stock:.2f} | "
            f"{best['us']:.1f} {best['us'] / stock:.2f} {best['config']}"
        )


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["qsweep-report"]:  # qsweep-report NCU_CSV PLAN_JSON [OUT_JSON]
        rows = qsweep_report(argv[1], argv[2])
        print_qsweep(rows)
        if len(argv) > 3:
            with open(argv[3], "w") as f:
                json.dump(rows, f, indent=1)
        return 0
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "what",
        nargs="+",
        choices=(
            "check",
            "qcheck",
            "tune",
            "midtune",
            "qtune",
            "quick",
            "host",
            "profile",
            "qprofile",
            "qsweep",
        ),
    )
    ap.add_argument("--json", help="write every row here")
    args = ap.parse_args(argv)
    if not hopper.available():
        print("the Hopper path is not available here (needs an sm_90 GPU and cuda-bindings)")
        return 2
    res = Results()
    for what in args.what:
        try:
            jobs = {"check": check, "tune": tune, "profile": profile, "host": host}
            jobs["midtune"] = midtune
            jobs.update(qcheck=qcheck, qtune=qtune, qprofile=qprofile, qsweep=qsweep)
            jobs["quick"] = lambda r: tune(r, True)
            jobs[what](res)
        except Exception:  # noqa: BLE001 - keep the rows measured so far
            traceback.print_exc()
            res.failed += 1
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res.rows, f, indent=1)
    print(f"{len(res.rows)} rows, {res.failed} failed")
    return 1 if res.failed else 0


if __name__ == "__main__":
    sys.exit(main())
