"""bi-bench: what the invariant path costs, measured beside stock MLX in the same run.

    bi-bench --quick              # CPU-sized cases, about five minutes on 2 cores
    bi-bench --json bench.json    # the H200 profile; every number saved
    bi-bench --only e2e --model-dir /tmp/qwen3-17b --json e2e.json   # the Qwen3-1.7B workload

Kernels: bf16 GEMM, 4-bit quantized GEMM, decode and prefill attention, each as the mode's
implementation and as stock MLX on identical inputs, sampled alternately after warm-up; the
median per call is reported with the ratio ours / stock (below 1 is faster) and, where the
project set one, the target ceiling (BENCHMARK.md, "Targets"). End to end (bi_rl.bench.e2e):
rollout decode tokens/s with the mode, without it and with mlx-lm's batch_generate, the
engine's time per step against the bare model step, prefill and rescoring tokens/s, and
start-up times. Ratios are printed last.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

import mlx.core as mx
import orjson

from bi_rl import __version__, backends
from bi_rl._source import source_digest
from bi_rl.backends import device_name
from bi_rl.bench import kernels
from bi_rl.cli import settings_refused
from bi_rl.rollout.paths import OutputError, check_output, make_parent, write_atomic


def _batch_sizes(text: str) -> tuple[int, ...]:
    """B,B,...: positive batch sizes."""
    try:
        sizes = tuple(int(b) for b in text.split(","))
    except ValueError:
        sizes = ()
    if not sizes or any(b < 1 for b in sizes):
        raise argparse.ArgumentTypeError(f"batch sizes are positive integers, B,B,...: {text!r}")
    return sizes


def _labels(text: str) -> tuple[str, ...]:
    return tuple(label.strip() for label in text.split(",") if label.strip())


def setup_arg_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="bi-bench",
        description="Time the bi-rl invariant path beside stock MLX on the active backend.",
    )
    p.add_argument(
        "--quick", action="store_true", help="CPU-sized cases (about five minutes on 2 cores)"
    )
    p.add_argument(
        "--only",
        choices=["kernels", "gemm", "qmm", "attention", "e2e", "startup", "rescore-long"],
        help="run one part (gemm, qmm, attention: one family of the kernels alone; "
        "rescore-long: long-context rescoring, strict against off, split between GEMMs and "
        "attention; not in the default run)",
    )
    p.add_argument("--json", metavar="PATH", help="write every measurement as JSON")
    p.add_argument(
        "--repeats", type=int, metavar="N", help="end to end: runs per mode and case (default 3)"
    )
    p.add_argument(
        "--workload",
        choices=["qwen3-1.7b", "qwen2-0.5b"],
        default="qwen3-1.7b",
        help="end to end: the model shape and prompts (default qwen3-1.7b; --quick: a tiny Qwen3)",
    )
    p.add_argument(
        "--model-dir",
        metavar="DIR",
        help="end to end: where the workload's random-weight models are, written there if "
        "missing (default: a temporary directory)",
    )
    p.add_argument(
        "--batches",
        type=_batch_sizes,
        metavar="B,B",
        help="end to end: batch sizes to run (default: the workload's)",
    )
    p.add_argument(
        "--models",
        type=_labels,
        metavar="M,M",
        help="end to end and rescore-long: which of the workload's models to run, of bf16 and "
        "4-bit (default both), e.g. 4-bit alone to time a quantized kernel's change",
    )
    p.add_argument(
        "--long-batch", type=int, default=4, metavar="B", help="rescore-long: sequences (4)"
    )
    p.add_argument(
        "--long-length", type=int, default=8192, metavar="T", help="rescore-long: tokens (8192)"
    )
    p.add_argument("-v", "--verbose", action="store_true", help="print each case as it runs")
    return p


def commit() -> str:
    try:
        root = Path(__file__).resolve().parents[2]
        out = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
        )
        return out.stdout.strip() or "unknown"
    except OSError:
        return "unknown"


def long_table(report: dict) -> str:
    lines = [
        f"{'model':<6} {'B x T':>10} {'off s':>7} {'strict s':>8} {'strict/off':>10} "
        f"{'extra s':>7} {'gemm extra':>10} {'attn extra':>10} {'spread':>6}"
    ]
    for r in report["rows"]:
        lines.append(
            f"{r['model']:<6} {r['batch']:>4} x {r['length']:<5} {r['seconds_off']:>7.3f} "
            f"{r['seconds_strict']:>8.3f} {r['strict_vs_off']:>10.2f} {r['strict_extra_s']:>7.3f} "
            f"{r['gemm_extra_s']:>10.3f} {r['attention_extra_s']:>10.3f} {r['spread']:>6.2f}"
        )
    return "\n".join(lines)


def kernel_table(rows: list[dict]) -> str:
    lines = [
        f"{'kernel':<24} {'case':<22} {'ours ms':>9} {'stock ms':>9} {'ratio':>6} {'target':>6} "
        f"{'spread':>6} {'host us':>7} {'stock':>6} {'err ours':>9} {'err stock':>9} "
        f"{'bits != stock':>13}"
    ]
    for r in rows:
        if r["status"] != "ok":
            lines.append(f"{r['family']:<24} {r['case']:<22} {r['status'].upper()}: {r['detail']}")
            continue
        target = f"{r['target']:.2f}" if r["target"] else "-"
        miss = " MISS" if r["target"] and r["ratio"] > r["target"] else ""
        errs = (
            f"{r['ours_err']:>9.1e} {r['stock_err']:>9.1e}"
            if "ours_err" in r
            else f"{'-':>9} {'-':>9}"
        )
        host = (
            f"{r['ours_build_us']:>7.1f} {r['stock_build_us']:>6.1f}"
            if "ours_build_us" in r
            else f"{'-':>7} {'-':>6}"
        )
        lines.append(
            f"{r['family']:<24} {r['case']:<22} {r['ours_ms']:>9.4f} {r['stock_ms']:>9.4f} "
            f"{r['ratio']:>6.2f} {target:>6} {r['spread']:>6.2f} {host} {errs} "
            f"{r.get('differs_from_stock', '-'):>13}{miss}"
        )
    return "\n".join(lines)


def chain_table(rows: list[dict]) -> str:
    """The decode-sized products timed as a chain (bi_rl.bench.kernels.Chain): per call, ours,
    stock and the link alone; the ratio with the link on both sides, and without it (each
    side less the link's time, where both exceed it)."""
    lines = [
        f"{'kernel':<24} {'case':<22} {'ours ms':>9} {'stock ms':>9} {'link ms':>9} "
        f"{'ratio':>6} {'less link':>9} {'spread':>6}"
    ]
    for r in rows:
        if "chain_ratio" not in r:
            continue
        link = r["chain_link_ms"]
        ours, stock = r["chain_ours_ms"] - link, r["chain_stock_ms"] - link
        less = f"{ours / stock:>9.2f}" if ours > 0 and stock > 0 else f"{'-':>9}"
        lines.append(
            f"{r['family']:<24} {r['case']:<22} {r['chain_ours_ms']:>9.4f} "
            f"{r['chain_stock_ms']:>9.4f} {link:>9.4f} {r['chain_ratio']:>6.2f} {less} "
            f"{r['chain_spread']:>6.2f}"
        )
    return "\n".join(lines) if len(lines) > 1 else ""


def e2e_table(report: dict) -> str:
    lines = [
        f"{'model':<6} {'B':>3} {'decode tok/s: strict':>20} {'off':>9} {'mlx-lm':>9} "
        f"{'off/mlx':>7} {'strict/mlx':>10} {'step/bare strict':>16} {'off':>5} "
        f"{'wait strict':>11} {'off':>5} {'prefill':>7} {'rescore':>7} {'spread':>6}"
    ]
    for r in report["rows"]:
        lines.append(
            f"{r['model']:<6} {r['batch']:>3} {r['decode_tok_s_strict']:>20.1f} "
            f"{r['decode_tok_s_off']:>9.1f} {r['decode_tok_s_mlx_lm']:>9.1f} "
            f"{r['off_vs_mlx_lm']:>7.2f} {r['strict_vs_mlx_lm']:>10.2f} "
            f"{r['engine_vs_bare_strict']:>16.2f} {r['engine_vs_bare_off']:>5.2f} "
            f"{r['bare_wait_share_strict']:>11.2f} {r['bare_wait_share_off']:>5.2f} "
            f"{r['prefill_tok_s_strict'] / r['prefill_tok_s_off']:>7.2f} "
            f"{r['rescore_tok_s_strict'] / r['rescore_tok_s_off']:>7.2f} {r['spread']:>6.2f}"
        )
    return "\n".join(lines)


def e2e_step_table(report: dict) -> str:
    lines = [
        f"{'model':<6} {'B':>3} {'median step ms: strict':>22} {'off':>7} {'mlx-lm':>7} "
        f"{'off/mlx':>7} {'strict/mlx':>10} {'bare build ms: strict':>21} {'off':>5} "
        f"{'concat ms strict/off':>20} {'bare ms first/last: strict':>26} {'off':>11} "
        f"{'spread':>6}"
    ]
    for r in report["rows"]:
        lines.append(
            f"{r['model']:<6} {r['batch']:>3} {r['median_step_ms_strict']:>22.2f} "
            f"{r['median_step_ms_off']:>7.2f} {r['median_step_ms_mlx_lm']:>7.2f} "
            f"{r['median_step_off_vs_mlx_lm']:>7.2f} {r['median_step_strict_vs_mlx_lm']:>10.2f} "
            f"{r['bare_build_ms_strict']:>21.2f} {r['bare_build_ms_off']:>5.2f} "
            f"{_concat_ms(r):>20} {_first_last(r, 'strict'):>26} "
            f"{_first_last(r, 'off'):>11} {r['median_step_spread']:>6.2f}"
        )
    return "\n".join(lines)


def _concat_ms(row: dict) -> str:
    """Each mode's one build of its concatenated projections (ms), e.g. "14.1/10.0"."""
    off = row.get("concat_ms_off")  # absent from rows of runs before mode off concatenated
    return f"{row['concat_ms_strict']:.1f}/" + ("-" if off is None else f"{off:.1f}")


def _first_last(row: dict, mode: str) -> str:
    """The bare step timed before the rollouts and after them (ms), e.g. "6.35/7.37"."""
    first = row.get(f"bare_step_first_ms_{mode}")  # absent from rows of older runs
    last = row[f"bare_step_ms_{mode}"]
    return f"-/{last:.2f}" if first is None else f"{first:.2f}/{last:.2f}"


def startup_table(s: dict) -> str:
    return "\n".join(
        [
            f"{'bi-rollout s':>12} {'bi-rescore s':>12} {'mlx_lm.load s':>13} "
            f"{'rollout - load':>14} {'spread':>6}",
            f"{s['bi_rollout_s']:>12.2f} {s['bi_rescore_s']:>12.2f} {s['mlx_lm_load_s']:>13.2f} "
            f"{s['bi_rollout_over_load_s']:>14.2f} {s['spread']:>6.2f}",
        ]
    )


def main(argv=None) -> int:
    parser = setup_arg_parser()
    args = parser.parse_args(argv)
    if args.models is not None:
        if args.only not in (None, "e2e", "rescore-long"):
            parser.error("--models applies to the end-to-end parts (e2e, rescore-long)")
        from bi_rl.bench import e2e

        if not args.models:
            parser.error(f"--models: name at least one of {e2e.MODELS_TEXT}")
        try:
            e2e.check_models(args.models)
        except ValueError as e:
            parser.error(f"--models: {e}")
    if settings_refused("bi-bench"):
        return 2
    if args.json:
        try:  # before the minutes of timing, not after them
            check_output(args.json, "--json")
        except OutputError as e:
            parser.error(str(e))
    say = (lambda s: print(s, file=sys.stderr, flush=True)) if args.verbose else None
    meta = {
        "bi_rl": __version__,
        "commit": commit(),
        "source": source_digest(),
        "mlx": mx.__version__,
        "backend": backends.active().name,
        "device": device_name(),
        "profile": "quick" if args.quick else "full",
        "date": time.strftime("%Y-%m-%d"),
        "command": "bi-bench " + " ".join(sys.argv[1:] if argv is None else argv),
        # the switches that pick kernels and paths (BI_RL_HOPPER_DEEP=0, ...), as set
        "env": {k: v for k, v in sorted(os.environ.items()) if k.startswith("BI_RL_")},
    }
    print(" ".join(f"{k}={v}" for k, v in meta.items()), flush=True)
    # "complete" stays false until every part has run: the file is rewritten after each row,
    # so a run stopped by a time limit still leaves every row it finished
    report = {"meta": meta, "complete": False}

    def save() -> None:
        if args.json:
            make_parent(args.json)
            write_atomic(args.json, orjson.dumps(report, option=orjson.OPT_INDENT_2))

    def part(name: str):
        """on_row for one part: that part's rows so far into the report, saved at once."""

        def saved(rows) -> None:
            report[name] = rows
            save()

        return saved

    if args.only in (None, "kernels", "gemm", "qmm", "attention"):
        report["kernels"] = kernels.run(
            args.quick, progress=say, only=args.only, on_row=part("kernels")
        )
    workload = "tiny" if args.quick else args.workload
    if args.only in (None, "e2e"):
        from bi_rl.bench import e2e  # imports mlx-lm

        report["e2e"] = e2e.run(
            workload,
            repeats=args.repeats or 3,
            model_dir=args.model_dir,
            batches=args.batches,
            models=args.models or (),
            progress=say,
            on_row=part("e2e"),
        )
    if args.only in (None, "startup"):
        from bi_rl.bench import e2e

        report["startup"] = e2e.run_startup(
            workload, repeats=args.repeats or 3, model_dir=args.model_dir, progress=say
        )
    if args.only == "rescore-long":
        from bi_rl.bench import e2e

        report["rescore_long"] = e2e.run_long_rescore(
            workload,
            repeats=args.repeats or 3,
            model_dir=args.model_dir,
            batch=args.long_batch,
            length=args.long_length,
            models=args.models or (),
            progress=say,
            on_row=part("rescore_long"),
        )
    report["complete"] = True
    if "kernels" in report:
        print()
        print(
            "kernels: median per call, ratio = ours / stock (lower is better); host us: "
            "graph building per call, ours and stock (part of the call's time)"
        )
        print(kernel_table(report["kernels"]))
        chained = chain_table(report["kernels"])
        if chained:
            print()
            print(
                "the decode-sized products as a chain, each call's input depending on the "
                "last call's output through one small elementwise kernel (the link), as a "
                "model's layers depend on each other; the table above lets independent calls "
                "overlap on the GPU"
            )
            print(chained)
    if "e2e" in report:
        print()
        print(
            f"end to end ({report['e2e']['workload']}): decode tokens/s of bi-rl's engine with "
            "the mode (strict), without (off) and of mlx-lm's batch_generate (higher is "
            "better); step/bare = the engine's time per decode step over the model's alone "
            "(lower is better); wait = the share of the model's step the host spends waiting "
            "for the device (near 0: bound by the host, not the kernels); prefill and "
            "rescore = strict / off"
        )
        print(e2e_table(report["e2e"]))
        print()
        print(
            "decode step by step: each run's median time between two decode-only steps "
            "(one slow step cannot move it), the median over repeats; off/mlx and strict/mlx "
            "as decode speed (mlx-lm's step over ours; higher is better); bare build ms: the "
            "host's time to build one bare step's graph; concat ms: each mode's one build of its "
            "concatenated projections (mode off concatenates at more than one row a step on "
            "Hopper), once a run, outside every timing above; bare ms "
            "first/last: the bare step timed before the rollouts and after them (step/bare "
            "uses the last)"
        )
        print(e2e_step_table(report["e2e"]))
    if "startup" in report:
        print()
        print(
            f"start-up ({report['startup']['workload']}, bf16): median wall seconds of a fresh "
            "process, model files in the page cache: bi-rollout of one token, bi-rescore of its "
            "log, and a bare mlx_lm.load with every parameter evaluated"
        )
        print(startup_table(report["startup"]))
    if "rescore_long" in report:
        print()
        print(
            "long-context rescoring: median seconds per pass over every sequence; gemm_only / "
            "attention_only: only that family invariant (the rest stock); extra = seconds over off"
        )
        print(long_table(report["rescore_long"]))
    save()
    return 0


if __name__ == "__main__":
    sys.exit(main())
