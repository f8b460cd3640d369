"""bi-verify: prove the mode batch-invariant on this machine, and test stock MLX as a control.

    bi-verify --quick            # under a minute on a 2-core CPU
    bi-verify --json report.json # the full sweep, with every check's numbers saved
    bi-verify --log sweep.jsonl --resume --jobs 4   # a long sweep in pieces, workers in parallel
    bi-verify --model DIR        # your own model: a short rollout + rescoring round trip
    bi-verify --warmup --model DIR   # compile every kernel DIR's model needs, ahead of use

Every check compares raw bit patterns of rows computed alone with the same rows computed in
company (bigger batches, reversed batches, left padding, grown caches, decode vs prefill
chunks). The mode's sweep must find zero differing bits: any difference, or a case the
backend refuses in strict mode, exits 1. The same sweep over stock MLX is reported
separately: where stock is invariant too (MLX's CPU backend) that is a finding, not a failure.

With --model, instead of the op sweep: a rollout of the model at batch 8 and a rescoring of
every sample in full forward passes at batch 3, shuffled (bi_rl.verify.roundtrip), compared
bit for bit, then the same on stock MLX as the control. Exit 0 when the mode's round trip
has no differing bit and no refusal, 1 otherwise, 2 when the model cannot be loaded.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections import defaultdict

import mlx.core as mx
import orjson

from bi_rl import __version__, backends, verify
from bi_rl._source import source_digest
from bi_rl.backends import device_name
from bi_rl.cli import settings_refused
from bi_rl.mode import DEFAULT_MODE, MODES
from bi_rl.rollout.paths import OutputError, check_output, make_parent
from bi_rl.verify.sweeplog import SweepLog, SweepLogError


def setup_arg_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="bi-verify",
        description="Sweep GEMM, quantized GEMM, grouped projections and attention for batch "
        "invariance on this "
        "machine: the bi-rl mode must show zero differing bits; stock MLX is the control.",
    )
    p.add_argument("--quick", action="store_true", help="the small sweep (CI: under a minute)")
    p.add_argument("--json", metavar="PATH", help="write every check as JSON ('-' for stdout)")
    p.add_argument(
        "--only",
        choices=["gemm", "quantized", "attention", "grouped"],
        help="run one family of checks",
    )
    p.add_argument("--no-control", action="store_true", help="skip the stock MLX control sweep")
    p.add_argument(
        "--large",
        action="store_true",
        help="add model-sized GEMMs (K, N) = (896, 4864), (4864, 896) to the full sweep "
        "(default on GPU backends; minutes on a CPU)",
    )
    p.add_argument(
        "--jobs",
        type=int,
        default=None,
        metavar="N",
        help="run the sweep's checks in N worker processes (same checks, same report; on a GPU "
        "the full sweep is mostly first-use kernel compiles, which workers overlap; default: "
        f"1 on the CPU, up to {GPU_JOBS} on a GPU)",
    )
    p.add_argument(
        "--log",
        metavar="PATH",
        help="append each finished check to PATH (JSON lines) as it completes, so a sweep cut "
        "short keeps what it finished",
    )
    p.add_argument(
        "--resume",
        action="store_true",
        help="with --log: continue the sweep that log belongs to, running only the checks it "
        "lacks (the report holds them all)",
    )
    p.add_argument("-v", "--verbose", action="store_true", help="print each check as it runs")
    m = p.add_argument_group("a model of your own (--model)")
    m.add_argument(
        "--model",
        metavar="DIR",
        help="instead of the op sweep: rollout + rescoring round trip on this mlx-lm model "
        "directory, with a stock MLX control (--no-control skips it; --json saves the result)",
    )
    m.add_argument("--mode", choices=MODES, default=DEFAULT_MODE, help="run mode (default strict)")
    m.add_argument(
        "--prompts", type=int, default=8, metavar="N", help="random-token prompts (default 8)"
    )
    m.add_argument(
        "--new-tokens", type=int, default=32, metavar="N", help="tokens per sample (default 32)"
    )
    m.add_argument(
        "--max-prompt-length",
        type=int,
        metavar="N",
        default=2048,
        help="cap on prompt lengths (default 2048; lengths straddle the model's sliding window)",
    )
    m.add_argument(
        "--context",
        type=int,
        metavar="N",
        help="long-context check: prompts just under N tokens, so every sample's decoding "
        "crosses N keys (replaces the short prompts; --max-prompt-length does not apply)",
    )
    warm = p.add_argument_group("warm-up (instead of the sweep)")
    warm.add_argument(
        "--warmup",
        action="store_true",
        help="compile every kernel a model needs (a first run on a GPU compiles them at "
        "first use): the --model (default the embedded one) in --mode",
    )
    warm.add_argument(
        "--batch-size",
        type=int,
        default=None,
        help="with --warmup: the largest batch it will run (default: bi-rollout's)",
    )
    warm.add_argument(
        "--prefill-chunk",
        type=int,
        default=None,
        help="with --warmup: the prefill chunk it will use (default: bi-rollout's)",
    )
    return p


def warmup(args) -> int:
    """bi-verify --warmup: load the model and compile what it needs (bi_rl.verify.warmup)."""
    from bi_rl.model import ModelError, load_model, resolve_model
    from bi_rl.rollout.engine import DEFAULT_BATCH_SIZE, DEFAULT_PREFILL_CHUNK
    from bi_rl.verify.warmup import warm_up

    batch = args.batch_size or DEFAULT_BATCH_SIZE
    chunk = args.prefill_chunk or DEFAULT_PREFILL_CHUNK
    if batch < 1 or chunk < 1:
        print("bi-verify: error: --batch-size and --prefill-chunk must be >= 1", file=sys.stderr)
        return 2
    try:
        path, name = resolve_model(args.model)
        model, _ = load_model(path)
    except ModelError as e:
        print(f"bi-verify: error: {e}", file=sys.stderr)
        return 2
    backend = backends.active()
    print(
        f"bi-verify --warmup: {name} on the {backend.name} backend ({device_name()}), up to "
        f"{batch} rows, prefill chunks of {chunk}, mode {args.mode}",
        flush=True,
    )
    say = lambda s: print(s, flush=True)
    try:
        done = warm_up(model, batch_size=batch, prefill_chunk=chunk, mode=args.mode, say=say)
    except NotImplementedError as e:
        print(f"bi-verify: error: {e}", file=sys.stderr)
        return 2
    print(
        f"warm: {done['hopper_kernels_compiled']} bi-rl GEMM kernels compiled now "
        f"({done['compile_seconds']:.1f} s), the model run at {done['batch_sizes']} rows "
        f"({done['seconds']:.1f} s in all); later runs start without compiling"
    )
    if args.json:
        data = orjson.dumps({"warmup": done, "model": name, "backend": backend.name})
        write_json(args.json, data)
    return 0


def verify_model(args) -> int:
    """--model: the round trip, printed; returns the exit status."""
    from bi_rl.model import ModelError, load_model, resolve_model
    from bi_rl.verify.roundtrip import RoundTripConfig, round_trip

    try:
        cfg = RoundTripConfig(
            prompts=args.prompts,
            new_tokens=args.new_tokens,
            max_prompt_length=args.max_prompt_length,
            mode=args.mode,
            context=args.context,
            control=not args.no_control,
        )
        path, name = resolve_model(args.model)
        model, tokenizer = load_model(path)
        res = round_trip(model, tokenizer, cfg)
    except (ModelError, ValueError, NotImplementedError) as e:
        print(f"bi-verify: error: {e}", file=sys.stderr)
        return 2
    windows = [w for w in res.windows if w is not None]
    layers = f"{len(res.windows)} layers" + (
        f" ({len(windows)} with a sliding window of {min(windows)})" if windows else ""
    )
    print(f"  model {name}: {res.family} (mlx-lm {res.mlx_lm}), {layers}")
    print(
        f"  rollout: {cfg.prompts} random-token prompts ({min(res.prompt_lengths)}-"
        f"{max(res.prompt_lengths)} tokens), {cfg.new_tokens} new tokens each, batch "
        f"{cfg.batch_size}, T=1 top-p 0.95; rescoring: full forward passes, batch "
        f"{cfg.rescore_batch_size}, shuffled"
    )
    for note in res.notes:
        print(f"  note: {note}")

    def line(side) -> str:
        if side.error:
            return f"{'REFUSED' if side.refused else 'FAILED'}: {side.error}"
        first = ""
        if side.first:
            f = side.first
            first = (
                f"; first at prompt {f['prompt']} token {f['position']}: "
                f"{f['rollout']!r} vs {f['rescored']!r}"
            )
        return (
            f"{side.differing} of {side.tokens} logprobs and {side.rows_differing} of "
            f"{side.tokens} logit rows differ{first}"
        )

    print(f"  mode {res.mode.mode}: {line(res.mode)}")
    if res.control is not None:
        print(f"  stock MLX (control): {line(res.control)}")
    print()
    if res.ok:
        print(
            f"PASS: rollout and rescoring agree bitwise in mode {res.mode.mode}: 0 of "
            f"{res.mode.tokens:,} tokens differ."
        )
    else:
        print(f"FAIL: the round trip in mode {res.mode.mode} is not exact on this model.")
    c = res.control
    if c is not None and c.error is None:
        if c.differing or c.rows_differing:
            print(
                f"Control: stock MLX differs in {c.differing:,} of {c.tokens:,} tokens: the mode "
                "is what makes the logs exact here."
            )
        else:
            print(
                f"Finding: stock MLX was itself exact on the {backends.active().name} backend "
                "(not a failure: here the mode costs nothing and proves the same bits)."
            )
    if args.json:
        data = orjson.dumps({"model": name, **res.to_json()}, option=orjson.OPT_INDENT_2)
        write_json(args.json, data)
    return 0 if res.ok else 1


def summarize(checks) -> list[dict]:
    groups = defaultdict(lambda: {"checks": 0, "compared": 0, "differing": 0, "statuses": set()})
    for c in checks:
        g = groups[(c.family, c.dtype)]
        g["checks"] += 1
        g["compared"] += c.compared
        g["differing"] += c.differing
        g["statuses"].add(c.status)
    rows = []
    for (family, dtype), g in groups.items():
        statuses = g["statuses"]
        worst = next(s for s in ("error", "unsupported", "variant", "ok") if s in statuses)
        rows.append({"family": family, "dtype": dtype, **g, "result": worst, "statuses": None})
    return rows


RESULT_WORDS = {"ok": "invariant", "variant": "VARIANT", "unsupported": "REFUSED", "error": "ERROR"}


def table(title: str, checks) -> str:
    lines = [
        title,
        f"  {'family':<10} {'dtype':<9} {'checks':>6} {'compared':>11} {'differing':>10}  result",
    ]
    for r in summarize(checks):
        lines.append(
            f"  {r['family']:<10} {r['dtype']:<9} {r['checks']:>6} {r['compared']:>11,} "
            f"{r['differing']:>10,}  {RESULT_WORDS[r['result']]}"
        )
    for c in checks:
        if c.status != "ok":
            lines.append(f"    {c.status}: {c.case} [{c.dtype}]: {'; '.join(c.where) or c.detail}")
    return "\n".join(lines)


# Worker processes a GPU's sweep takes by default: most of its time is first-use kernel
# compiles, which workers overlap (each takes whole sets of checks that share kernels); more
# workers only time-slice the one GPU further.
GPU_JOBS = 8


def default_jobs(backend: str) -> int:
    """--jobs when not given: 1 on the CPU (its checks are compute, not compiles), else
    GPU_JOBS or the host's CPU count if smaller."""
    return 1 if backend == "cpu" else max(1, min(GPU_JOBS, os.cpu_count() or 1))


PROGRESS_EVERY_S = 20.0  # without -v, a progress line at most this often (stderr)


def every(seconds: float, say):
    """A progress callback that passes one line on at most every `seconds`, counting checks,
    so a sweep of many minutes (first-use kernel compiles on a GPU) is never silent; a check
    that did not pass is always passed on at once."""
    state = {"last": time.monotonic(), "done": 0}

    def progress(line: str) -> None:
        state["done"] += 1
        now = time.monotonic()
        if now - state["last"] >= seconds or ": ok (" not in line:  # failures always show
            state["last"] = now
            say(f"bi-verify: {state['done']} checks done; last {line}")

    return progress


def write_json(path: str, data: bytes) -> None:
    """--json's output: to stdout for '-', else to the file `check_outputs` passed."""
    if path == "-":
        sys.stdout.buffer.write(data + b"\n")
        return
    make_parent(path)
    with open(path, "wb") as f:
        f.write(data)


def check_outputs(args) -> str | None:
    """The problem with --json or --log as an output, checked before any work; else None."""
    try:
        if args.json and args.json != "-":
            reads = [(args.log, "the --log file")] if args.log else []
            check_output(args.json, "--json", reads)
        if args.log:
            check_output(args.log, "--log")
    except OutputError as e:
        return str(e)
    return None


def main(argv=None) -> int:
    args = setup_arg_parser().parse_args(argv)
    problem = check_outputs(args)
    if problem:
        print(f"bi-verify: error: {problem}", file=sys.stderr)
        return 2
    if (args.model is not None or args.warmup) and settings_refused("bi-verify"):
        return 2
    backend = backends.active()
    say = lambda s: print(s, file=sys.stderr, flush=True)
    header = (
        f"bi-verify {__version__}: backend {backend.name} ({device_name()}), mlx {mx.__version__}, "
        f"{'quick' if args.quick else 'full'} sweep, source {source_digest()}"
    )
    if args.warmup:
        return warmup(args)
    if args.model is not None:
        print(header.replace(f"{'quick' if args.quick else 'full'} sweep", "model round trip"))
        return verify_model(args)
    print(header, flush=True)
    for op, how in backend.how.items():
        print(f"  {op}: {how}")

    if args.jobs is None:
        # workers run the default device's backend: a backend chosen in this process alone
        # (backends.use) is honoured only here
        own = backend is backends.get(backends.default_name())
        args.jobs = default_jobs(backend.name) if own else 1
    if args.jobs < 1:
        print("bi-verify: error: --jobs must be >= 1", file=sys.stderr)
        return 2
    if args.resume and not args.log:
        print("bi-verify: error: --resume needs --log PATH", file=sys.stderr)
        return 2
    progress = say if args.verbose else every(PROGRESS_EVERY_S, say)
    large = args.large or backend.name != "cpu"
    log = None
    if args.log:
        meta = {
            "source": source_digest(),
            "backend": backend.name,
            "device": device_name(),
            "mlx": mx.__version__,
            "sweep": "quick" if args.quick else "full",
            "large": large,
            "only": args.only,
        }
        try:
            make_parent(args.log)
            log = SweepLog(args.log, meta, args.resume)
        except (SweepLogError, OSError) as e:
            print(f"bi-verify: error: {e}", file=sys.stderr)
            return 2
        if log.done:
            say(f"bi-verify: resuming {args.log}: {len(log.done)} checks done before")
    done = log.done if log else None
    record = log.record if log else None
    opsets = [verify.MODE] + ([] if args.no_control else [verify.STOCK])
    try:
        if args.jobs == 1:
            runs = {
                o.name: verify.run(o, args.quick, progress, args.only, large, done, record)
                for o in opsets
            }
        else:
            names = [o.name for o in opsets]
            runs = verify.run_parallel(
                names, args.quick, args.jobs, progress, args.only, large, done, record
            )
    finally:
        if log:
            log.close()
    mode = runs[verify.MODE.name]
    stock = runs.get(verify.STOCK.name, [])
    print()
    print(table("bi-rl mode (strict)", mode))
    if stock:
        print()
        print(table("stock MLX (control)", stock))

    mode_bad = [c for c in mode if c.status != "ok"]
    compared = sum(c.compared for c in mode)
    print()
    if mode_bad:
        print(
            f"FAIL: the mode is not invariant here: {len(mode_bad)} of {len(mode)} checks failed."
        )
    else:
        print(
            f"PASS: the mode is batch-invariant: 0 of {compared:,} elements differ "
            f"in {len(mode)} checks."
        )
    if stock:
        stock_variant = [c for c in stock if c.status == "variant"]
        n_diff = sum(c.differing for c in stock_variant)
        if stock_variant:
            print(
                f"Control: stock MLX is batch-variant on the {backend.name} backend: it differs "
                f"in {len(stock_variant)} of {len(stock)} checks ({n_diff:,} elements in the "
                "rows where each of those checks stopped, at its first difference)."
            )
        else:
            print(
                f"Finding: stock MLX was itself batch-invariant on the {backend.name} backend in "
                f"all {len(stock)} checks (not a failure: here the mode costs nothing and proves "
                "the same bits)."
            )
    if args.json:
        report = {
            "bi_rl": __version__,
            "source": source_digest(),
            "mlx": mx.__version__,
            "backend": backend.name,
            "device": device_name(),
            "sweep": "quick" if args.quick else "full",
            "passed": not mode_bad,
            "mode": [c.as_dict() for c in mode],
            "stock": [c.as_dict() for c in stock],
        }
        data = orjson.dumps(report, option=orjson.OPT_INDENT_2)
        write_json(args.json, data)
    return 1 if mode_bad else 0


if __name__ == "__main__":
    sys.exit(main())
