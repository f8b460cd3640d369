"""The bi-verify sweep: every check of the plan, run through one op set.

`plan(quick)` lists the cases: float32/float16/bfloat16 x GEMM shapes (odd K and N included,
nn.Linear layout with and without bias, matmul on W.T, addmm) x batch sizes 1..512, affine
quantized 2/4/8-bit x groups 32/64/128, and attention with query lengths 1..32 (8 and 9
included) x key counts on both sides of 256, 512 (the split), 1024 and 4096 x mask forms x
left padding, head dims up to 256, sliding windows (both sides of the window's edge, a ring
after several wraps, the window as an argument and as a mask), and sibling projections in
one grouped call (plain and quantized, each member's rows against its own op's).
`run(ops, quick)` executes them and reports per check; it never stops at a failure.
`run_parallel` spreads the checks of one or both op sets over worker processes (a GPU's sweep
is mostly first-use kernel compiles and host work, which several processes overlap), each
set of checks that launch the same kernels in one worker (`affinity`: MLX keeps the kernels
it compiles in the compiling process); every worker rebuilds the same plan and runs the
checks it is given, so the results are the same checks in the same order as `run`'s.
"""

from __future__ import annotations

import multiprocessing
import queue
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor

import mlx.core as mx

from bi_rl.verify.attention import attention_check, window_check
from bi_rl.verify.core import DTYPES, MODE, STOCK, STOP_AT_FIRST, Check, FirstDifference
from bi_rl.verify.gemm import gemm_check, grouped_check, quantized_check

QUICK_BATCHES = (1, 2, 3, 7, 8, 9, 16, 33, 64)
FULL_BATCHES = (1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 31, 32, 33, 63, 64, 65, 127, 128, 129, 255,
                256, 257, 511, 512)  # fmt: skip
LAYOUTS = ("linear", "linear+bias", "matmul x@W.T", "addmm")


def plan(quick: bool, large: bool = False) -> Iterator[tuple[str, Callable]]:
    """(label, fn(ops) -> Check) for every check of the quick or the full sweep.

    `large` adds model-sized GEMMs (a 0.5B model's projections), which take minutes on a CPU.
    """
    batches = QUICK_BATCHES if quick else FULL_BATCHES
    shapes = [(64, 96), (127, 65)] if quick else [(64, 96), (127, 65), (257, 255), (896, 640)]
    if large and not quick:
        shapes += [(896, 4864), (4864, 896)]
    key = 0
    for dname, dtype in DTYPES.items():
        for k, n in shapes:
            for layout in LAYOUTS:
                key += 3
                yield (
                    f"gemm {layout} {dname} K={k} N={n}",
                    lambda ops, a=(layout, dname, dtype, k, n, batches, key): gemm_check(ops, *a),
                )
    qdtypes = {"bfloat16": mx.bfloat16} if quick else DTYPES
    qbatches = (1, 7, 8, 9, 33) if quick else batches
    qk, qn = (256, 96) if quick else (512, 257)
    for dname, dtype in qdtypes.items():
        for bits in (2, 4, 8):
            for group in (32, 64, 128):
                key += 3
                args = (dname, dtype, qk, qn, bits, group, qbatches, key)
                yield (
                    f"quantized {bits}-bit g{group} {dname}",
                    lambda ops, a=args: quantized_check(ops, *a),
                )
    if quick:
        contexts, qlens, dims, pads = (255, 256, 257, 4097), (1, 2, 7, 8, 9, 32), (64,), (0, 37)
    else:
        contexts = (1, 2, 255, 256, 257, 511, 513, 1023, 1024, 1025, 4095, 4096, 4097)
        qlens, dims, pads = tuple(range(1, 33)), (64, 80, 96, 128, 256), (0, 1, 37, 300)
    for dname, dtype in DTYPES.items():
        for d in dims:
            for t in contexts:
                key += 10
                ref_q = 32 if quick or d != 64 else t  # full sweep: the reference is a full prefill
                deep = None if quick else (1, 8, 9, 32)  # sinks, grown cache, padding
                args = (dname, dtype, t, qlens, d, 4, 2, pads, key, ref_q, deep)
                yield (
                    f"attention {dname} D={d} keys={t}",
                    lambda ops, a=args: attention_check(ops, *a),
                )
    if quick:  # head dim 256 once, on both sides of 256 keys
        for t in (255, 257):
            key += 10
            args = ("bfloat16", mx.bfloat16, t, (1, 8, 9), 256, 4, 2, (37,), key, 9, None)
            yield (
                f"attention bfloat16 D=256 keys={t}",
                lambda ops, a=args: attention_check(ops, *a),
            )
    key = yield from _window_plan(quick, key)
    yield from _grouped_plan(quick, batches, key)


def _grouped_plan(quick: bool, batches, key: int) -> Iterator[tuple[str, Callable]]:
    """Sibling projections in one grouped call (last in the plan: a log of an older sweep
    keeps its indices): three members whose widths a decode launch's block widths divide
    and two that do not divide them alike, plain and quantized, across the batch sizes where
    the one-launch path stops (16 rows plain, 64 quantized)."""
    plain = ("bfloat16",) if quick else tuple(DTYPES)
    quantized = (
        [(d, b) for d in ("bfloat16",) for b in (4,)]
        if quick
        else [(d, b) for d in ("bfloat16", "float16") for b in (2, 4, 8)]
    )
    width_sets = [(128, 64, 64)] if quick else [(128, 64, 64), (96, 40)]
    for widths in width_sets:
        for dname in plain:
            key += 5
            args = (dname, DTYPES[dname], 127, widths, batches, key)
            yield (
                f"grouped linear {dname} N={'+'.join(map(str, widths))}",
                lambda ops, a=args: grouped_check(ops, *a),
            )
        for dname, b in quantized:
            key += 5
            args = (dname, DTYPES[dname], 256, widths, batches, key, b, 64)
            yield (
                f"grouped {b}-bit {dname} N={'+'.join(map(str, widths))}",
                lambda ops, a=args: grouped_check(ops, *a),
            )


def _window_plan(quick: bool, key: int):
    """Sliding windows: window - 1, window, window + 1 keys and several wraps of a ring.
    Yields the plan's entries and returns the last key used."""
    if quick:
        cases = [(dn, 64, 100, t) for dn in DTYPES for t in (101, 257)] + [
            ("bfloat16", 256, 100, 257)
        ]
    else:
        cases = [
            (dn, d, w, t)
            for dn in DTYPES
            for d in (64, 128, 256)
            for w in (100, 256, 1000)
            for t in (w - 1, w, w + 1, 3 * w + 37)
        ]
    for dname, d, w, t in cases:
        key += 10
        args = (dname, DTYPES[dname], t, w, d, 4, 2, key)
        yield (
            f"attention {dname} D={d} window={w} keys={t}",
            lambda ops, a=args: window_check(ops, *a),
        )
    return key


def _failed(label: str, status: str, detail: str) -> Check:
    """The check a plan entry stands for when it could not run (family and dtype from its label)."""
    words = label.split()
    dtype = next((d for d in DTYPES if d in words), "")
    return Check(words[0], label, dtype, status=status, detail=detail)


def run_one(label: str, fn: Callable, ops) -> Check:
    token = STOP_AT_FIRST.set(bool(getattr(ops, "first_difference", False)))
    try:
        return fn(ops)
    except FirstDifference as e:
        return e.check
    except NotImplementedError as e:
        return _failed(label, "unsupported", str(e))
    except Exception as e:  # a crash in one case must not hide the others
        return _failed(label, "error", f"{type(e).__name__}: {e}")
    finally:
        STOP_AT_FIRST.reset(token)


def _entries(quick: bool, large: bool, only: str | None) -> Iterator[tuple[int, str, Callable]]:
    """(plan index, label, fn) of the plan's checks, or of one family's."""
    for i, (label, fn) in enumerate(plan(quick, large)):
        if not only or label.split()[0] == only:
            yield i, label, fn


# A finished check, as run() and run_parallel() report it to their `record` callback:
# record(op set name, plan index, label, check). `done` maps (op set name, plan index) to checks
# finished earlier (a resumed sweep), which are reported as they are and not run again.
Record = Callable[[str, int, str, Check], None]


def run(
    ops,
    quick: bool,
    progress: Callable[[str], None] | None = None,
    only: str | None = None,
    large: bool = False,
    done: dict | None = None,
    record: Record | None = None,
) -> list[Check]:
    """Run every check of the plan (or of one family) through `ops`."""
    results = []
    for i, label, fn in _entries(quick, large, only):
        if done and (ops.name, i) in done:
            results.append(done[(ops.name, i)])
            continue
        start = time.perf_counter()
        check = run_one(label, fn, ops)
        mx.clear_cache()
        if record:
            record(ops.name, i, label, check)
        if progress:
            progress(f"{ops.name}: {label}: {check.status} ({time.perf_counter() - start:.1f}s)")
        results.append(check)
    return results


OPSETS = {MODE.name: MODE, STOCK.name: STOCK}


def affinity(label: str) -> str:
    """Checks that launch the same kernels, by label: attention checks of one dtype, head dim
    and window (their key counts, masks and padding pick among a few instantiations of that
    kernel), and every other check on its own. MLX keeps the kernels it compiles for a CUDA
    device in the process that compiled them, so a worker that runs a whole set compiles its
    kernels once, where workers sharing the set would each compile them."""
    words = label.split()
    if words[0] != "attention":
        return label
    return " ".join(w for w in words if not w.startswith("keys="))


def work_sets(opsets, labels, done) -> list[tuple[str, list[int]]]:
    """The checks still to run, as (op set, plan indices) sets of one `affinity` each, in
    plan order within a set and the largest sets first (so the longest work starts first)."""
    sets: dict[tuple[str, str], list[int]] = {}
    for name in opsets:
        for i, label in labels:
            if (name, i) not in done:
                sets.setdefault((name, affinity(label)), []).append(i)
    order = sorted(sets.items(), key=lambda kv: -len(kv[1]))  # stable: plan order among ties
    return [(name, indices) for (name, _), indices in order]


def _worker(opset: str, indices: list[int], quick: bool, large: bool, results) -> None:
    """The plan's `indices` through op set `opset` in one worker process, one after another;
    each finished check goes to the `results` queue at once (a sweep cut short keeps it)."""
    entries = {i: e for i, e in enumerate(plan(quick, large)) if i in set(indices)}
    for i in indices:
        label, fn = entries[i]
        start = time.perf_counter()
        check = run_one(label, fn, OPSETS[opset])
        mx.clear_cache()
        results.put((opset, i, check.as_dict(), time.perf_counter() - start))


def _drain(results, finish) -> None:
    """Hand every check already in the `results` queue to `finish`."""
    while True:
        try:
            name, i, data, seconds = results.get_nowait()
        except queue.Empty:
            return
        finish(name, i, Check(**data), seconds)


def run_parallel(
    opsets: list[str],
    quick: bool,
    jobs: int,
    progress: Callable[[str], None] | None = None,
    only: str | None = None,
    large: bool = False,
    done: dict | None = None,
    record: Record | None = None,
) -> dict[str, list[Check]]:
    """`run` for each op set named in `opsets` (MODE.name, STOCK.name), the checks spread
    over `jobs` worker processes a set of one `affinity` at a time; each op set's checks come
    back in plan order."""
    labels = [(i, label) for i, label, _ in _entries(quick, large, only)]
    names = dict(labels)
    done = done or {}
    out: dict[str, dict[int, Check]] = {
        name: {i: done[(name, i)] for i, _ in labels if (name, i) in done} for name in opsets
    }

    def finish(name, i, check, seconds):
        out[name][i] = check
        if record:
            record(name, i, names[i], check)
        if progress:
            progress(f"{name}: {names[i]}: {check.status} ({seconds:.1f}s)")

    ctx = multiprocessing.get_context("spawn")  # a fresh MLX in each worker, never a fork
    with ctx.Manager() as manager, ProcessPoolExecutor(max_workers=jobs, mp_context=ctx) as pool:
        results = manager.Queue()
        futures = {
            pool.submit(_worker, name, indices, quick, large, results): (name, indices)
            for name, indices in work_sets(opsets, labels, done)
        }
        pending = set(futures)
        while pending:
            try:
                name, i, data, seconds = results.get(timeout=0.2)
            except queue.Empty:
                for fut in [f for f in pending if f.done()]:
                    pending.discard(fut)
                    _drain(results, finish)  # what the set queued before it ended
                    if fut.exception() is None:
                        continue
                    # a worker that died must not hide the other checks: the set's checks it
                    # did not finish are reported failed, the other sets run on
                    e = fut.exception()
                    name, indices = futures[fut]
                    detail = f"worker failed: {type(e).__name__}: {e}"
                    for i in indices:
                        if i not in out[name]:
                            finish(name, i, _failed(names[i], "error", detail), 0.0)
                continue
            finish(name, i, Check(**data), seconds)
        _drain(results, finish)
    return {name: [checks[i] for i, _ in labels] for name, checks in out.items()}
