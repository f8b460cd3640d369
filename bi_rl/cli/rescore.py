"""bi-rescore: recompute every logged logprob with a full forward pass and compare bit for bit.

    bi-rollout && bi-rescore                     # the embedded default, end to end
    bi-rescore rollout.jsonl                     # the model the log names, a new composition
    bi-rescore run.jsonl --model DIR --batch-size 3 --order reversed --chunk 16
    bi-rescore run.jsonl --json > report.json    # machine-readable report
    mlx.launch --backend ring -n 2 -- bi-rescore run.jsonl   # data parallel, the same report
    python -m bi_rl.cli.rescore --help

Each record is rescored in a batch composition different from the rollout's (by default a
batch size one below the rollout's and a shuffled order, as whole sequences rather than
token-by-token decode) and compared with the log: tokens compared, bitwise-equal count,
the first divergent (sample, position) with both values, max |d logprob|, and the KL
estimators k1, k2, k3 of KL(rollout || rescored) (verl: rollout_corr/kl, rollout_corr/k3_kl).

Exit status: 0 every logprob and logit-row fingerprint is bitwise equal; 1 some differ;
2 the log or the model cannot be used (the message names why).
"""

from __future__ import annotations

import argparse
import os
import sys
from contextlib import ExitStack

from bi_rl.cli import ProgressBar, default_log_missing, settings_refused
from bi_rl.dist.world import DEFAULT_RANK_TIMEOUT
from bi_rl.mode import MODES
from bi_rl.rollout.run import DEFAULT_OUT
from bi_rl.score.rescore import ORDERS

PROG = "bi-rescore"
EXIT_OK, EXIT_DIFFER, EXIT_ERROR = 0, 1, 2


def setup_arg_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=PROG,
        description="Rescore a bi-rl rollout log: recompute each token's float32 logprob and "
        "logit-row fingerprint in full forward passes, batched differently from the rollout, "
        "and report bitwise mismatches and KL estimators.",
        epilog="Exit status: 0 all tokens bitwise equal, 1 some differ, 2 unusable input.",
    )
    p.add_argument(
        "log",
        metavar="LOG",
        nargs="?",
        default=DEFAULT_OUT,
        help=f"rollout log written by bi-rollout (default: {DEFAULT_OUT}, bi-rollout's default)",
    )
    p.add_argument(
        "--model",
        help="mlx-lm model directory (default: the model named in the log's header; the "
        "embedded default for logs made with it)",
    )
    p.add_argument(
        "--batch-size",
        type=int,
        help="samples per forward pass (default: one below the rollout's, read from "
        "LOG.run.json; 7 if unknown, 2 if the rollout used 1)",
    )
    p.add_argument(
        "--order",
        choices=ORDERS,
        default="shuffled",
        help="order samples are batched in (default: shuffled)",
    )
    p.add_argument(
        "--shuffle-seed", type=int, default=0, help="seed of the shuffled order (default: 0)"
    )
    p.add_argument(
        "--chunk",
        type=int,
        help="feed CHUNK positions at a time through a KV cache (default: whole sequences)",
    )
    p.add_argument(
        "--mode",
        choices=MODES,
        help="batch_invariant_mode for the forward passes: strict, fallback, or off (stock "
        "MLX: a negative control); default: the mode the log was made with (its header)",
    )
    p.add_argument(
        "--force",
        action="store_true",
        help="rescore even when the model, tokenizer or backend differs from the log's header",
    )
    p.add_argument(
        "--rank-timeout",
        type=float,
        default=DEFAULT_RANK_TIMEOUT,
        metavar="SECONDS",
        help="under mlx.launch or mpirun: how long a rank waits for the others before it "
        f"declares them gone and stops (default: {DEFAULT_RANK_TIMEOUT:g})",
    )
    p.add_argument("--json", action="store_true", help="print the full report as JSON")
    p.add_argument("--report", metavar="FILE", help="also write the JSON report to FILE")
    return p


def _fmt_kl(r) -> str:
    if r.k1_mean == 0 and r.k2_max == 0 and r.k3_max == 0:
        return "KL exactly 0 (k1 = k2 = k3 = 0 on every token)"
    return f"KL k3 mean {r.k3_mean:.6g} (k1 mean {r.k1_mean:.6g})"


def render(result) -> str:
    """The readable table for a RescoreResult."""
    from bi_rl.score.report import format_table

    r, c = result.report, result.composition
    lines = [
        f"{PROG}: {result.log}: {r.samples} samples, model {result.model}, "
        f"backend {result.header_checks['backend']['here']}, mode {c['mode']} "
        f"(from {c['mode_from']})"
    ]
    for k in result.forced:
        chk = result.header_checks[k]
        lines.append(f"  warning: {k} differs from the log ({chk['log']} vs {chk['here']}), forced")
    for note in result.env_notes:
        lines.append(f"  note: {note}")
    lines.append(f"  rollout:  {c['rollout']} (mode {c['rollout_mode']})")
    ranks = f" on {c['ranks']} ranks" if c.get("ranks", 1) > 1 else ""
    lines.append(
        f"  rescore:  {c['rescore']}, batch size {c['batch_size']}, order {c['order']}, "
        f"{c['batches']} batches{ranks}, {c['padded_rows']} padded rows"
    )
    if not c["differs_from_rollout"]:
        lines.append("  note: batch size and order equal the rollout's")
    lines.append(format_table(r))
    rate = r.tokens / result.seconds if result.seconds > 0 else 0.0
    verdict = "OK" if result.ok else "MISMATCH"
    lines.append(
        f"{verdict}: {r.differing} of {r.tokens} tokens differ, "
        f"{r.fingerprints_compared - r.fingerprints_equal} logit rows differ; "
        f"{_fmt_kl(r)}  [{result.seconds:.2f} s, {rate:,.0f} tok/s]"
    )
    return "\n".join(lines)


def _stopped(e: BaseException, world, bar: ProgressBar) -> int:
    """Say why the rescoring stopped (one line) and return the exit status; an exception that
    is no user-facing stop is raised again."""
    from bi_rl import dist
    from bi_rl.model import ModelError
    from bi_rl.rollout.log import LogError

    if isinstance(e, dist.DistError):
        dist.report_error(PROG, e, world)
        return EXIT_ERROR
    if isinstance(e, (LogError, ModelError, ValueError, NotImplementedError)):
        bar.finish()
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return EXIT_ERROR
    if isinstance(e, dist.Terminated):
        print(f"{PROG}: rank {world.rank}: {e}", file=sys.stderr)
        return 143
    if isinstance(e, KeyboardInterrupt):
        print(f"\n{PROG}: interrupted", file=sys.stderr)
        return 130
    raise e


def main(argv=None) -> int:
    args = setup_arg_parser().parse_args(argv)
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    from bi_rl import dist
    from bi_rl.rollout.paths import OutputError, check_output
    from bi_rl.score.rescore import RescoreConfig, rescore_log

    if default_log_missing(PROG, args.log) or settings_refused(PROG):
        return EXIT_ERROR
    if args.report:
        try:  # before minutes of rescoring, and never over the log it reads
            check_output(args.report, "--report", [(args.log, "the log being rescored")])
        except OutputError as e:
            print(f"{PROG}: error: {e}", file=sys.stderr)
            return EXIT_ERROR
    world = None
    bar = ProgressBar("samples rescored")  # on a terminal only
    # `held` keeps a data-parallel run's SIGTERM handling (bi_rl.dist.sigterm_raises) in place
    # until the reason the run stopped is printed (mlx.launch stops every rank with SIGTERM
    # once one fails).
    with ExitStack() as held:
        try:
            cfg = RescoreConfig(
                log=args.log,
                model=args.model,
                batch_size=args.batch_size,
                order=args.order,
                shuffle_seed=args.shuffle_seed,
                chunk=args.chunk,
                mode=args.mode,
                force=args.force,
            )
            world = dist.World.join(args.rank_timeout)
            if world.size > 1:
                held.enter_context(dist.sigterm_raises())
                result = dist.rescore(cfg, world)
            else:
                result = rescore_log(cfg, progress=bar.update)
        except BaseException as e:
            # A SIGTERM from here on cannot cut the message short; one landing while e is
            # handled is raised at this call (stopping's doc), and e says more. Not
            # contextlib.suppress: building it is a call of its own, where the signal could land.
            try:  # noqa: SIM105
                dist.stopping()
            except dist.Terminated:
                pass
            return _stopped(e, world, bar)
    bar.finish()
    status = EXIT_OK if result.ok else EXIT_DIFFER
    if world.rank != 0:  # rank 0 speaks for the run; every rank computed the same report
        # A launcher that sees a rank exit nonzero (here: the log differs) terminates the
        # others, so the other ranks leave only once rank 0 has reported.
        world.leave_together()
        return status
    try:
        return _report(result, args, status)
    finally:
        world.leave_together()


def _report(result, args, status: int) -> int:
    """Rank 0's (or the one process's) report: to --report, and as JSON or text on stdout."""
    import orjson

    from bi_rl.rollout.paths import make_parent

    data = orjson.dumps(result.to_json(), option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS)
    if args.report:
        try:
            make_parent(args.report)
            with open(args.report, "wb") as f:
                f.write(data + b"\n")
        except OSError as e:
            print(f"{PROG}: error: cannot write {args.report!r}: {e.strerror}", file=sys.stderr)
            return EXIT_ERROR
    if args.json:
        sys.stdout.write(data.decode() + "\n")
    else:
        print(render(result))
    sys.stdout.flush()  # before the other ranks are let go (see main)
    return status


if __name__ == "__main__":
    sys.exit(main())
