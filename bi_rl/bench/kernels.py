"""Kernel benchmarks: each invariant op beside stock MLX on the same inputs, same run.

Cases (the H200 profile; `quick` shrinks them for a CPU): bf16 GEMM in the nn.Linear layout on
the weight shapes (K, N) of Qwen3-1.7B (2048 x 2048, 2048 x 6144, 6144 x 2048 and the
2048 x 151936 logits) and Llama-3-8B (4096 x 4096, 4096 x 14336, 14336 x 4096, 4096 x 128256)
at M = 1, 8, 64, 512, 4096 and 16384 (not the 16384-row logits); the same shapes 4-bit (group
64) at M = 1, 8, 64, 512, 4096; decode attention (one query token, Qwen3-1.7B heads: 16 query /
8 KV, head dim 128) at 512..131072 keys and batch 1..64; causal prefill attention of one
sequence at 2048..16384 tokens with those heads and 32 / 8 heads of 64; the prefill of 8
left-padded sequences of 2048 tokens under a bool mask; a decode step of 64 left-padded rows
over 8192 keys under a bool mask (the engine's decode batch); head dim 256 (4 / 1 heads,
Gemma-3-1B); a 4096-key sliding window, given as the kernel's window (stock: a mask) and as the
windowed KV caches give it (a mask noted with its window, both sides). Where the weights fit in
the L2 cache several copies are used in turn, as a model's layers would be, so memory-bound
cases stream from memory on both sides. Each row gives both sides' relative error against a
float64 reference where that is cheap (M <= 64), and how many output elements of ours and stock
differ in their bits (a guard that the two sides ran different kernels: 0 on the CPU, where the
mode runs stock MLX's own kernels), and each side's graph-building time per call
(`timing.build_s`): the host's share of a call, which is most of a small one's. The products of
up to 64 rows are also timed as chains (`Chain`), each call waiting for the last as a model's
layers do.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import mlx.core as mx
import numpy as np

from bi_rl import _mask_window as mask_window
from bi_rl import _stock, ops
from bi_rl.backends.composed import window_mask
from bi_rl.bench.timing import build_s, compare, compare_many
from bi_rl.verify.core import bits, f64, rand, relerr

BF16 = mx.bfloat16
QWEN3_17B = ((2048, 2048), (2048, 6144), (6144, 2048), (2048, 151936))
LLAMA3_8B = ((4096, 4096), (4096, 14336), (14336, 4096), (4096, 128256))
GEMM_SHAPES = QWEN3_17B + LLAMA3_8B
ROTATE_BYTES = 240_000_000  # weights per case at least this large: past the H200's 60 MB L2


@dataclass
class Case:
    family: str
    label: str
    ours: Callable[[], mx.array]
    stock: Callable[[], mx.array]
    reference: Callable[[], np.ndarray] | None = None  # float64 result, when cheap
    target: float | None = None  # the project's ceiling for ours / stock (BENCHMARK.md)
    # the same two computations as Chains (decode-sized products): see `Chain`
    chained: tuple[Chain, Chain] | None = None
    # the two sides on the reference's inputs, for the bits and error columns, where the
    # timed calls turn through several weight copies (None: ours and stock themselves)
    fixed: tuple[Callable[[], mx.array], Callable[[], mx.array]] | None = None


# x + 0 * y as one fused elementwise kernel: x, made to depend on y without changing a value
# (y finite)
_link = mx.compile(lambda x, y: x + 0 * y)


class Chain:
    """`op(x)` called again and again, each call's input made to depend on the previous call's
    output through `_link` (x + 0 * its first element): one small elementwise kernel a call.

    MLX's CUDA backend orders the kernels of one evaluation by their data alone, so the calls
    of a sample that are independent of each other (`timing.compare`'s) may run side by side
    on the GPU, and a kernel that leaves most multiprocessors idle then looks as fast as the
    calls it overlaps. A model's decode step is a chain: each product waits for the one
    before. A chain's time per call is the product's latency plus the link's, which
    `Chain(None, x)` (the link alone, chained) measures."""

    def __init__(self, op: Callable[[mx.array], mx.array] | None, x: mx.array):
        self.op, self.x, self.prev = op, x, None

    def __call__(self) -> mx.array:
        x = self.x if self.prev is None else _link(self.x, self.prev[..., :1, :1])
        self.prev = x if self.op is None else self.op(x)
        return self.prev


def _copies(nbytes: int, quick: bool) -> int:
    return 1 if quick else max(1, min(8, -(-ROTATE_BYTES // nbytes)))


def _gemm_target(m: int, n: int) -> float | None:
    if m == 1:
        return 1.15
    if m in (8, 64):
        return 1.2 if n > 100_000 and m == 64 else 1.1
    return 1.2 if m >= 4096 else None


def gemm_cases(quick: bool) -> Iterator[Case]:
    shapes = ((896, 896), (896, 4864)) if quick else GEMM_SHAPES
    ms = (1, 8, 64) if quick else (1, 8, 64, 512, 4096, 16384)
    for k, n in shapes:
        ws = [rand((n, k), BF16, 1 + i, scale=k**-0.5) for i in range(_copies(n * k * 2, quick))]
        for m in ms:
            if m == 16384 and n > 100_000:
                continue
            x = rand((m, k), BF16, 2 + m)
            ref = (lambda x=x, w=ws[0]: f64(x) @ f64(w).T) if m <= 64 else None
            yield _product(
                "gemm bf16", m, k, n, ops.linear, _stock.linear, x, ws, ref, _gemm_target(m, n)
            )


def qmm_cases(quick: bool) -> Iterator[Case]:
    shapes = ((896, 896),) if quick else GEMM_SHAPES
    for k, n in shapes:
        qs = []
        for i in range(_copies(n * k // 2, quick)):
            w = rand((n, k), BF16, 3 + i, scale=k**-0.5)
            qs.append((*mx.quantize(w, group_size=64, bits=4), True, 64, 4, "affine"))
        w_deq = mx.dequantize(*qs[0][:3], group_size=64, bits=4)
        for m in (1, 8, 64) if quick else (1, 8, 64, 512, 4096):
            x = rand((m, k), BF16, 4 + m)
            ref = (lambda x=x, w=w_deq: f64(x) @ f64(w).T) if m <= 64 else None
            target = 1.2 if m <= 64 else 1.3 if m == 4096 else None
            yield _product("qmm 4-bit g64", m, k, n, _qmm_ours, _qmm_stock, x, qs, ref, target)


def _qmm_ours(x, w):
    return ops.quantized_matmul(x, *w)


def _qmm_stock(x, w):
    return _stock.quantized_matmul(x, *w)


def _product(family, m, k, n, ours, stock, x, ws, ref, target) -> Case:
    """A product case: `ours(x, w)` against `stock(x, w)`, each call taking the next of the
    weight copies `ws` in turn (the two sides turn through one cycle of them), and both on the
    first copy, the reference's, for the bits and error columns; decode-sized (M <= 64) also as
    chains."""
    nxt = itertools.cycle(ws).__next__

    def turning(op):
        return lambda v: op(v, nxt())

    ours_next, stock_next = turning(ours), turning(stock)
    return Case(
        family,
        f"M={m} K={k} N={n}",
        lambda: ours_next(x),
        lambda: stock_next(x),
        ref,
        target,
        (Chain(ours_next, x), Chain(stock_next, x)) if m <= 64 else None,
        (lambda: ours(x, ws[0]), lambda: stock(x, ws[0])),
    )


def _attention(q, k, v, mask, ours: bool, window: int | None = None):
    """Ours with the kernel-level window (keys before it are never read); stock with the
    equivalent mask, which it must read whole."""
    scale = q.shape[-1] ** -0.5
    if ours:
        return ops.scaled_dot_product_attention(q, k, v, scale, mask, window=window)
    if window is not None:
        mask = window_mask(q.shape[2], k.shape[2], window)
    return _stock.scaled_dot_product_attention(q, k, v, scale=scale, mask=mask)


# (query heads, kv heads, head dim): Qwen3-1.7B, Llama-3-8B-like 32/8 at head dim 64 and
# Gemma-3-1B (head dim 256)
ATTN_HEADS = {"16/8 D=128": (16, 8, 128), "32/8 D=64": (32, 8, 64), "4/1 D=256": (4, 1, 256)}
ATTN_TARGET = {"decode": 1.15, "prefill": 1.3, "other": 1.3}


# MLX's random generator refuses arrays this large ("[RandomBits::eval_gpu] Large size
# unsupported" at 64 rows x 131072 keys), so such inputs are drawn one batch row at a time.
LARGE = 2**30


def rand_rows(shape, dtype, key: int) -> mx.array:
    """rand(shape, dtype, key), or for more than LARGE elements the rows along axis 0 drawn
    one at a time (keys key * 1000 + row) and concatenated."""
    if int(np.prod(shape)) <= LARGE:
        return rand(shape, dtype, key)
    rows = [rand((1, *shape[1:]), dtype, key * 1000 + i) for i in range(shape[0])]
    return mx.concatenate(rows, axis=0)


def attention_cases(quick: bool) -> Iterator[Case]:
    """Decode (one query token a row, no mask) and causal prefill of one sequence, at the
    head shapes above; a left-padded batch's prefill and decode step under a bool mask; head
    dim 256 and a 4096-key sliding window (ours: the kernel's window, stock: a window mask) at
    fewer sizes."""
    # 16384: where split mode starts (attention.SPLIT_FROM_KEYS)
    contexts = (512, 2048) if quick else (512, 8192, 16384, 32768, 131072)
    batches = (1, 8) if quick else (1, 8, 32, 64)
    tokens = (256, 512) if quick else (2048, 8192, 16384)
    window = 128 if quick else 4096

    def case(family, label, q, k, v, mask, target, win=None):
        return Case(
            family,
            label,
            lambda: _attention(q, k, v, mask, True, win),
            lambda: _attention(q, k, v, mask, False, win),
            target=target,
        )

    def decode(heads, b, ctx, win=None, target=ATTN_TARGET["decode"]):
        hq, hkv, d = ATTN_HEADS[heads]
        q = rand((b, hq, 1, d), BF16, 5)
        k, v = rand_rows((b, hkv, ctx, d), BF16, 6), rand_rows((b, hkv, ctx, d), BF16, 7)
        what = "attention decode bf16" + (f" window {win}" if win else "")
        return case(what, f"{heads} B={b} keys={ctx}", q, k, v, None, target, win)

    def prefill(heads, t, win=None, target=ATTN_TARGET["prefill"]):
        hq, hkv, d = ATTN_HEADS[heads]
        q, k, v = (rand((1, hq if i == 0 else hkv, t, d), BF16, 8 + i) for i in range(3))
        what = "attention prefill bf16" + (f" window {win}" if win else "")
        mask = None if win else "causal"
        return case(what, f"{heads} tokens={t}", q, k, v, mask, target, win)

    for ctx in contexts:
        for b in batches:
            yield decode("16/8 D=128", b, ctx)
    for heads in ("16/8 D=128", "32/8 D=64"):
        for t in tokens:
            yield prefill(heads, t)

    def padded(heads, b, t, target=ATTN_TARGET["prefill"]):
        # A left-padded batch's prefill (mlx-lm's batch_generate layout): b prompts
        # left-padded to t tokens (sequence s by s t / (2 b) tokens), causal, the padding
        # hidden by a bool mask that both sides read.
        hq, hkv, d = ATTN_HEADS[heads]
        q, k, v = (rand((b, hq if i == 0 else hkv, t, d), BF16, 11 + i) for i in range(3))
        row, col = mx.arange(t)[:, None], mx.arange(t)[None, :]
        mask = mx.stack([(col <= row) & (col >= s * t // (2 * b)) for s in range(b)])[:, None]
        label = f"{heads} B={b} tokens={t}"
        return case("attention prefill bf16 left-padded", label, q, k, v, mask, target)

    def padded_decode(heads, b, ctx, target=ATTN_TARGET["decode"]):
        # The engine's decode step over a left-padded batch cache: row s's history starts
        # s ctx / (2 b) keys in, the padding hidden by a bool mask that both sides read.
        hq, hkv, d = ATTN_HEADS[heads]
        q = rand((b, hq, 1, d), BF16, 14)
        k, v = rand_rows((b, hkv, ctx, d), BF16, 15), rand_rows((b, hkv, ctx, d), BF16, 16)
        col = mx.arange(ctx)[None, :]
        mask = mx.stack([col >= s * ctx // (2 * b) for s in range(b)])[:, None]
        label = f"{heads} B={b} keys={ctx}"
        return case("attention decode bf16 left-padded", label, q, k, v, mask, target)

    yield padded("16/8 D=128", 8, tokens[0])
    yield padded_decode("16/8 D=128", batches[-1], contexts[1])
    other = ATTN_TARGET["other"]
    yield decode("4/1 D=256", 8, contexts[1], target=other)
    yield prefill("4/1 D=256", tokens[0], target=other)
    yield decode("16/8 D=128", 8, contexts[-1 if quick else 2], window, target=other)
    yield prefill("16/8 D=128", tokens[-1], window, target=other)

    def cache_window(heads, b, tq, ctx):
        # The windowed KV caches' form (bi_rl.rollout.caches), which the engine and scorer
        # use: the window folded into a bool mask that is noted with it (bi_rl._mask_window),
        # both sides given that mask.
        hq, hkv, d = ATTN_HEADS[heads]
        q = rand((b, hq, tq, d), BF16, 17)
        k, v = rand_rows((b, hkv, ctx, d), BF16, 18), rand_rows((b, hkv, ctx, d), BF16, 19)
        mask = window_mask(tq, ctx, window)
        mask_window.note(mask, window)
        what = f"attention {'decode' if tq == 1 else 'prefill'} bf16 window {window} as a mask"
        return case(what, f"{heads} B={b} queries={tq} keys={ctx}", q, k, v, mask, other)

    yield cache_window("16/8 D=128", 8, 1, contexts[-1 if quick else 2])
    yield cache_window("16/8 D=128", 1, tokens[-1], tokens[-1])


def run(
    quick: bool,
    progress: Callable[[str], None] | None = None,
    only: str | None = None,
    on_row: Callable[[list[dict]], None] | None = None,
) -> list[dict]:
    """Every case (or only one family's: only = "gemm", "qmm" or "attention"), timed beside
    stock MLX; on_row, if given, gets the rows so far after each case (to save them as they
    come)."""
    rows = []
    samples = 7 if quick else 15
    families = {"gemm": gemm_cases, "qmm": qmm_cases, "attention": attention_cases}
    parts = [make(quick) for name, make in families.items() if only in (None, "kernels", name)]
    for case in itertools.chain(*parts):  # lazily: one case's arrays alive at a time
        row = {"family": case.family, "case": case.label, "target": case.target}
        try:
            ours, stock = compare(case.ours, case.stock, samples=samples)
        except NotImplementedError as e:
            row.update(status="refused", detail=str(e))
        except RuntimeError as e:  # one case the device cannot run must not end the table
            row.update(status="error", detail=str(e).splitlines()[0][:200])
        else:
            row.update(
                status="ok",
                ours_ms=ours.median_s * 1e3,
                stock_ms=stock.median_s * 1e3,
                ratio=ours.median_s / stock.median_s,
                spread=max(ours.spread, stock.spread),
                inner=ours.inner,
                ours_build_us=build_s(case.ours, ours.inner) * 1e6,
                stock_build_us=build_s(case.stock, stock.inner) * 1e6,
            )
            if case.chained is not None:
                # the link alone on its own: its calls are far shorter than a product's, and
                # the sides of one comparison share one inner count
                chain_ours, chain_stock = compare(*case.chained, samples=samples)
                link = compare_many({"link": Chain(None, case.chained[0].x)}, samples=samples)
                row.update(
                    chain_ours_ms=chain_ours.median_s * 1e3,
                    chain_stock_ms=chain_stock.median_s * 1e3,
                    chain_link_ms=link["link"].median_s * 1e3,
                    chain_ratio=chain_ours.median_s / chain_stock.median_s,
                    chain_spread=max(chain_ours.spread, chain_stock.spread),
                )
            a, b = (f() for f in case.fixed or (case.ours, case.stock))
            row["differs_from_stock"] = int((bits(a) != bits(b)).sum())
            if case.reference is not None:
                ref = case.reference()
                row.update(ours_err=relerr(a, ref), stock_err=relerr(b, ref))
        mx.clear_cache()
        if progress:
            progress(f"{case.family} {case.label}: {row.get('ratio', row['status'])}")
        rows.append(row)
        if on_row:
            on_row(rows)
    return rows
