"""bi-rollout: batched, batch-invariant generation into an exact, hash-chained rollout log.

    bi-rollout                                   # the embedded model and prompts
    bi-rollout --model DIR --prompts FILE --n 4 --temperature 1.0 --out run.jsonl
    bi-rollout ... --out run.jsonl --resume      # continue a killed run
    bi-rollout ... --out run.jsonl --overwrite   # replace it, once the new run has samples
    mlx.launch --backend ring -n 2 -- bi-rollout ...   # data parallel (bi_rl.dist)
    python -m bi_rl.cli.rollout --help

The log (default rollouts/run.jsonl; format: bi_rl/rollout/schema.py) is identical, byte for
byte, whatever --batch-size, --prefill-chunk, the scheduling or the number of ranks;
timings go to OUT.run.json.
Every input (model, prompts, context length, the mode's support for the model's ops) is
checked before the output is touched; warnings and errors are one line each.
"""

from __future__ import annotations

import argparse
import os
import sys
import warnings
from contextlib import ExitStack

from bi_rl.assets import DEFAULT_MAX_TOKENS as EMBEDDED_MAX_TOKENS
from bi_rl.cli import ProgressBar, add_sampling_args, sampler_config, settings_refused
from bi_rl.dist.world import DEFAULT_RANK_TIMEOUT
from bi_rl.mode import DEFAULT_MODE, MODES
from bi_rl.rollout.engine import DEFAULT_BATCH_SIZE, DEFAULT_MAX_TOKENS, DEFAULT_PREFILL_CHUNK
from bi_rl.rollout.run import DEFAULT_OUT

PROG = "bi-rollout"


def setup_arg_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=PROG,
        description="Generate completions with an mlx-lm model and log every token exactly "
        "(float32 logprob bits, logit-row fingerprint, chained hash). With no --model and no "
        "--prompts, uses the small model and prompt set embedded in bi-rl.",
    )
    src = p.add_argument_group("model and prompts")
    src.add_argument(
        "--model", help="mlx-lm model directory (or a hub id where a hub is reachable)"
    )
    src.add_argument(
        "--prompts", help="prompt file (.jsonl, .json, .csv, .parquet) or saved datasets dir"
    )
    src.add_argument(
        "--prompt-field",
        default="prompt",
        help="field holding the prompt text or chat messages (default: prompt)",
    )
    src.add_argument(
        "--id-field",
        default="id",
        help="field holding a unique prompt id (default: id; else the row index)",
    )
    src.add_argument("--split", help="split to use from a saved DatasetDict")
    src.add_argument("--limit", type=int, help="use only the first LIMIT prompts")
    tmpl = src.add_mutually_exclusive_group()
    tmpl.add_argument(
        "--chat-template",
        dest="chat_template",
        action="store_true",
        default=None,
        help="require the tokenizer's chat template (default: use it when present)",
    )
    tmpl.add_argument(
        "--no-chat-template",
        dest="chat_template",
        action="store_false",
        help="encode prompt text as is",
    )
    smp = p.add_argument_group("sampling")
    smp.add_argument("--n", type=int, default=1, help="samples per prompt (default: 1)")
    add_sampling_args(smp)
    smp.add_argument(
        "--max-tokens",
        type=int,
        help=f"completion length limit (default: {DEFAULT_MAX_TOKENS}; {EMBEDDED_MAX_TOKENS} with "
        "the embedded model, whose context is 64 positions)",
    )
    smp.add_argument(
        "--stop",
        action="append",
        default=[],
        metavar="TEXT",
        help="stop string (repeatable); the EOS tokens always stop",
    )
    run = p.add_argument_group("run")
    run.add_argument(
        "--batch-size",
        type=int,
        default=DEFAULT_BATCH_SIZE,
        help=f"sequences decoded together (default: {DEFAULT_BATCH_SIZE}); never changes the log",
    )
    run.add_argument(
        "--prefill-chunk",
        type=int,
        default=DEFAULT_PREFILL_CHUNK,
        help=f"prompt tokens per prefill step (default: {DEFAULT_PREFILL_CHUNK})",
    )
    run.add_argument(
        "--mode",
        choices=MODES,
        default=DEFAULT_MODE,
        help=f"batch_invariant_mode: strict, fallback (stock MLX where no invariant kernel "
        f"exists, with a warning) or off (stock MLX throughout); default: {DEFAULT_MODE}",
    )
    run.add_argument(
        "--out", default=DEFAULT_OUT, help=f"log file to write (default: {DEFAULT_OUT})"
    )
    again = run.add_mutually_exclusive_group()
    again.add_argument("--resume", action="store_true", help="continue the run that wrote --out")
    again.add_argument(
        "--overwrite",
        action="store_true",
        help="replace an existing --out (once the new run has written its first samples)",
    )
    run.add_argument(
        "--allow-long-context",
        action="store_true",
        help="run prompts longer than the model's configured context (max_position_embeddings) "
        "without an error, and prompt + --max-tokens past it without a warning: for models "
        "known to extrapolate",
    )
    run.add_argument(
        "--rank-timeout",
        type=float,
        default=DEFAULT_RANK_TIMEOUT,
        metavar="SECONDS",
        help="under mlx.launch or mpirun: how long a rank waits for the others before it "
        f"declares them gone and stops, the log resumable (default: {DEFAULT_RANK_TIMEOUT:g})",
    )
    run.add_argument("-q", "--quiet", action="store_true", help="no progress bar or summary")
    return p


class Progress(ProgressBar):
    """The progress bar over samples and generated tokens, then a one-line summary."""

    def __init__(self, stream=None, quiet: bool = False):
        super().__init__("samples", stream, quiet)

    def __call__(self, step, done: int, total: int) -> None:
        self.update(done, total, step.generated)

    def close(self, summary) -> None:
        if self.quiet:
            return
        self.finish()
        self.stream.write(f"{PROG}: {summary_line(summary)}\n")


def _count(n: int, what: str) -> str:
    return f"{n} {what}" if n == 1 else f"{n} {what}s"


def summary_line(summary) -> str:
    """What a run did, counting only what this run wrote (a resumed run continues a log)."""
    start = summary.resumed_from or 0
    if summary.resumed_from is not None and start == summary.records:
        return (
            f"{summary.log} is already complete ({start} of {summary.records} samples); "
            "nothing to do"
        )
    ranks = f" on {summary.ranks} ranks" if summary.ranks > 1 else ""
    done = (
        f"({summary.generated_tokens} tokens in {summary.seconds:.2f} s{ranks}, "
        f"{summary.tokens_per_s or 0:,.0f} tok/s)"
    )
    if summary.resumed_from is None:
        return f"wrote {_count(summary.records, 'sample')} to {summary.log} {done}"
    new = _count(summary.records - start, "new sample")
    return f"resumed {summary.log} at {start} of {summary.records} samples: wrote {new} {done}"


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    print(f"{PROG}: warning: {message}", file=sys.stderr)


def _config(args):
    """The RolloutConfig the arguments ask for (ValueError names a bad one)."""
    from bi_rl.rollout.engine import EngineConfig
    from bi_rl.rollout.run import RolloutConfig

    if args.limit is not None and args.limit < 1:
        raise ValueError(f"--limit must be >= 1, got {args.limit}")
    max_tokens = args.max_tokens
    if max_tokens is None:
        max_tokens = EMBEDDED_MAX_TOKENS if args.model is None else DEFAULT_MAX_TOKENS
    sampler = sampler_config(args)
    engine = EngineConfig(
        n=args.n,
        max_tokens=max_tokens,
        stop_strings=tuple(args.stop),
        batch_size=args.batch_size,
        prefill_chunk=args.prefill_chunk,
        mode=args.mode,
    )
    return RolloutConfig(
        model=args.model,
        prompts=args.prompts,
        out=args.out,
        prompt_field=args.prompt_field,
        id_field=args.id_field,
        split=args.split,
        chat_template=args.chat_template,
        limit=args.limit,
        sampler=sampler,
        engine=engine,
        resume=args.resume,
        overwrite=args.overwrite,
        allow_long_context=args.allow_long_context,
    )


def _stopped(e: BaseException, world) -> int:
    """Say why the run stopped (one line) and return the exit status; an exception that is
    no user-facing stop is raised again."""
    from bi_rl import dist
    from bi_rl.model import ModelError
    from bi_rl.rollout.log import LogError
    from bi_rl.rollout.prompts import PromptError
    from bi_rl.rollout.run import RolloutError, RolloutInterrupted

    errors = (ModelError, RolloutError, PromptError, LogError, ValueError, NotImplementedError)
    if isinstance(e, dist.DistError):
        dist.report_error(PROG, e, world)
        return dist.EXIT_RANK_LOST if e.lost else 1
    if isinstance(e, errors):
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 1
    if isinstance(e, dist.Terminated):
        print(f"{PROG}: rank {world.rank}: {e}; continue with --resume", file=sys.stderr)
        return 143
    if isinstance(e, RolloutInterrupted):
        if e.resumable:
            print(f"\n{PROG}: interrupted; continue with --resume", file=sys.stderr)
        else:
            print(
                f"\n{PROG}: interrupted before the first sample was written; nothing was "
                f"written to {e.out}",
                file=sys.stderr,
            )
        return 130
    if isinstance(e, KeyboardInterrupt):
        print(f"\n{PROG}: interrupted before the run began; nothing was written", file=sys.stderr)
        return 130
    raise e


def main(argv=None) -> int:
    args = setup_arg_parser().parse_args(argv)
    if settings_refused(PROG):
        return 1
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    from bi_rl import dist
    from bi_rl.rollout.run import rollout

    world = None
    # `held` keeps a data-parallel run's SIGTERM handling (bi_rl.dist.sigterm_raises) in place
    # until the reason the run stopped is printed: mlx.launch stops every rank with SIGTERM
    # once one fails, and with the default handler back a rank could die between recording
    # the stop and saying so.
    with warnings.catch_warnings(), ExitStack() as held:
        warnings.showwarning = _show_warning  # one line each, like the errors
        try:
            cfg = _config(args)
            world = dist.World.join(args.rank_timeout)
            progress = Progress(quiet=args.quiet or world.rank != 0)
            if world.size > 1 or dist.spool_path(cfg.out).exists():
                # Data parallel, or resuming a data-parallel run's log on one process.
                held.enter_context(dist.sigterm_raises())
                summary = dist.rollout(cfg, world, progress)
            else:
                summary = rollout(cfg, progress)
        except BaseException as e:
            # A SIGTERM from here on cannot cut the message short; one landing while e is
            # handled is raised at this call (stopping's doc), and e says more. Not
            # contextlib.suppress: building it is a call of its own, where the signal could land.
            try:  # noqa: SIM105
                dist.stopping()
            except dist.Terminated:
                pass
            return _stopped(e, world)
    if summary is not None:  # rank 0 speaks for a data-parallel run
        progress.close(summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
