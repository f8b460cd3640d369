"""Where the scorer's time goes, per mode: the host building and queuing each batch's graph
against the host blocked on the device, on bi-bench's end-to-end workload.

    PYTHONPATH=. python tools/score_parts.py [--workload qwen3-1.7b] [--model-dir DIR] \
        [--models bf16] [--batches 1,8] [--items N] [--new N] [--repeats 3] [--json out.json]

bi-rescore's rate is the scorer's (bi_rl.score.scorer.score): each batch's forward pass is
built layer by layer, each layer queued on the device as it is built, and batch i + 1 is
built while the device runs batch i, its first evaluation waiting for batch i (`settle`);
a batch's results are read once the next is queued. Strict mode's rescoring runs below mode
off's rate at small batches, and the remedy depends on which side bounds it: if the host
is never blocked, the device idles while the host builds and queues (the mode's dispatch
and launch costs are what to cut); if the host waits, the device's kernels are (their
block shapes at a few hundred rows, say).

The tool times `score()` on `--items` sequences (the workload's prompts, random completions
of `--new` tokens, by default the workload's new tokens; as many sequences as the batch by
default, as bi-bench's rescoring row scores them)
at each batch size, the modes alternating within each repeat, and splits the wall time
into `build` (inside the batch builder: building the graph, the mode's dispatch), `submit`
(inside its mx.async_eval calls: MLX encoding and launching the layers it queues) and
`wait` (blocked on the device: the builder's wait for the batch before, its synchronous
evaluations, as of a split output head's earlier pieces or of earlier chunks, and reading
each batch's last outputs); the rest is the scorer's bookkeeping. Medians over repeats.
`submit` is host work only while the device keeps up: where the device falls behind the
launches, a launch blocks until it catches up, and that wait is counted there (a `submit`
that moves with the kernels' block shapes, as in the `--fill` arm, is such a wait).
Guard: the builder ran once a batch (the count is checked).

With `--fill`, a third arm, `strict-ranges`, runs strict mode with one Hopper GEMM block
shape per row range (BI_RL_HOPPER_FILL=0: 128 x 256 blocks past 64 rows even where they
leave multiprocessors idle, as at a few hundred rows) against the default, whose shapes
follow the output's size; same bits, so only its time is compared, in the same
alternation as the other two.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from pathlib import Path
from unittest.mock import patch

import mlx.core as mx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # concat_ab, beside this script
from concat_ab import (  # noqa: E402
    alternated,
    arm_medians,
    each_batch,
    workload_args,
    workload_parser,
    write_rows,
)

MODES = ("strict", "off")
PHASES = ("total", "build", "submit", "host", "wait")
FILL_ARM = "strict-ranges"
# Each arm: the mode it scores in and the environment it runs with.
ARMS = {
    "strict": ("strict", {}),
    "off": ("off", {}),
    FILL_ARM: ("strict", {"BI_RL_HOPPER_FILL": "0"}),
}
# The CUDA modules whose launch plans (kept per argument signature) hold a block shape.
PLAN_MODULES = ("gemm", "hopper", "hopper_qmm", "attention", "qmm", "softmax_kernel")


def forget_plans() -> int:
    """Empty every CUDA launch-plan table, so that the next calls choose their block shapes
    under the environment they run in (a plan is built once per signature); the number of
    tables emptied (0 where the CUDA backend is not importable)."""
    import importlib

    from bi_rl.backends.cuda._kernels import Plans

    n = 0
    for name in PLAN_MODULES:
        try:
            mod = importlib.import_module(f"bi_rl.backends.cuda.{name}")
        except ImportError:
            continue
        for table in vars(mod).values():
            if isinstance(table, Plans):
                table.clear()
                n += 1
    return n


def make_items(model, w, n: int, new: int, seed: int) -> list:
    """n scoring items: the workload's prompts, each with `new` random completion tokens."""
    from bi_rl.bench import e2e
    from bi_rl.score.scorer import Item

    vocab = model.args.vocab_size
    rng = np.random.default_rng(seed)
    prompts = e2e.make_prompts(n, w.prompt_lens, vocab, seed=seed)
    return [Item(p.tokens, tuple(int(t) for t in rng.integers(4, vocab, new))) for p in prompts]


class _TimedMx:
    """mlx.core as a module sees it, with `eval` and `async_eval` timed into `spent` while
    `counting` (inside the batch builder, outside its wait for the batch before)."""

    def __init__(self, spent: dict):
        self._spent = spent
        self.counting = False

    def _timed(self, key: str, fn, *args):
        if not self.counting:
            return fn(*args)
        t = time.perf_counter()
        try:
            return fn(*args)
        finally:
            self._spent[key] += time.perf_counter() - t

    def eval(self, *args):
        return self._timed("eval", mx.eval, *args)

    def async_eval(self, *args):
        return self._timed("submit", mx.async_eval, *args)

    def __getattr__(self, name):
        return getattr(mx, name)


def timed_score(model, items, batch: int, mode: str) -> dict:
    """Seconds of one score() call: `total`; inside the batch builder, `build` (building the
    graph), `submit` (mx.async_eval: MLX encoding and launching the queued layers and the
    last chunk; the host can block here where the device falls behind the launches) and
    the host blocked on the device, `wait` (the builder's wait for the batch before, its
    synchronous evaluations of split output heads or earlier chunks, and reading each
    batch's last outputs); `host` = build + submit; and the number of batches built."""
    from bi_rl.score import queued, scorer

    spent = {"batch": 0.0, "settle": 0.0, "read": 0.0, "eval": 0.0, "submit": 0.0, "batches": 0}
    real_batch, real_results = scorer._score_batch, scorer._Pending.results
    timed_mx = _TimedMx(spent)

    def build(model, plan, items, cfg, derive, trace, group, settle, queue):
        def timed_settle():
            timed_mx.counting = False
            t = time.perf_counter()
            settle()
            spent["settle"] += time.perf_counter() - t
            timed_mx.counting = True

        t = time.perf_counter()
        timed_mx.counting = True
        try:
            job = real_batch(model, plan, items, cfg, derive, trace, group, timed_settle, queue)
        finally:
            timed_mx.counting = False
        spent["batch"] += time.perf_counter() - t
        spent["batches"] += 1
        return job

    def results(self):
        t = time.perf_counter()
        out = real_results(self)
        spent["read"] += time.perf_counter() - t
        return out

    cfg = scorer.ScoreConfig(batch_size=batch, mode=mode)
    with (
        patch.object(scorer, "_score_batch", build),
        patch.object(scorer._Pending, "results", results),
        patch.object(scorer, "mx", timed_mx),
        patch.object(queued, "mx", timed_mx),
    ):
        start = time.perf_counter()
        scorer.score(model, items, cfg)
        total = time.perf_counter() - start
    build_s = spent["batch"] - spent["settle"] - spent["eval"] - spent["submit"]
    return {
        "total": total,
        "build": build_s,
        "submit": spent["submit"],
        "host": build_s + spent["submit"],
        "wait": spent["settle"] + spent["eval"] + spent["read"],
        "batches": spent["batches"],
    }


def time_batch(model, items, batch: int, repeats: int, arms=MODES) -> dict:
    """Median phases (ms) per arm (a mode, or FILL_ARM), the arms alternating within each
    repeat (after one warm-up call each: kernels compiled, sets built, allocator sized)."""
    from bi_rl.bench import e2e

    def side(arm: str, warm: bool) -> dict:  # the warm-up is a whole call too
        mode, env = ARMS[arm]
        if FILL_ARM in arms:  # every arm rebuilds its plans, so all pay the same host cost
            forget_plans()
        with patch.dict(os.environ, env), e2e.sets_built(model, mode):
            return timed_score(model, items, batch, mode)

    want = math.ceil(len(items) / batch)
    out = {}
    for m, rs in alternated(list(arms), side, repeats).items():
        if any(x["batches"] != want for x in rs):
            raise RuntimeError(f"the scorer built {rs[0]['batches']} batches, expected {want}")
        out[m] = arm_medians(rs, PHASES, "total")
    return out


def setup_arg_parser() -> argparse.ArgumentParser:
    p = workload_parser(__doc__, "bf16")
    p.set_defaults(batches="1,8")
    p.add_argument("--items", type=int, default=0, help="sequences scored (0: the batch size)")
    p.add_argument(
        "--new", type=int, default=0, help="completion tokens a sequence (0: the workload's)"
    )
    p.add_argument(
        "--fill", action="store_true", help=f"add the {FILL_ARM} arm (BI_RL_HOPPER_FILL=0)"
    )
    return p


def main(argv=None) -> int:
    from bi_rl.bench import e2e

    args = setup_arg_parser().parse_args(argv)
    try:
        models, batches = workload_args(args)
        if args.items < 0 or args.new < 0:
            raise ValueError("--items and --new must be >= 0")
    except ValueError as e:
        print(f"score_parts: {e}", file=sys.stderr)
        return 2
    w = e2e.WORKLOADS[args.workload]
    new = args.new or w.new_tokens
    rows = []
    for label, model, b in each_batch(args, models, batches):
        items = make_items(model, w, args.items or b, new, seed=b)
        row = {"model": label, "batch": b, "items": len(items), "new": new}
        arms = (*MODES, FILL_ARM) if args.fill else MODES
        row |= time_batch(model, items, b, args.repeats, arms)
        rows.append(row)
        parts = " | ".join(
            f"{m}: {row[m]['total']:7.2f} ms, build {row[m]['build']:6.2f}, "
            f"submit {row[m]['submit']:6.2f}, wait {row[m]['wait']:6.2f}"
            for m in arms
        )
        ratio = row["off"]["total"] / row["strict"]["total"]
        fill = ""
        if args.fill:
            fill = f", {FILL_ARM}/strict time {row[FILL_ARM]['total'] / row['strict']['total']:.3f}"
        print(
            f"{label:6} B={b:<3} items={len(items):<3} {parts} | strict/off rate "
            f"{ratio:.3f}{fill}, spread {max(row[m]['spread'] for m in arms):.2f}",
            flush=True,
        )
    write_rows(args, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
