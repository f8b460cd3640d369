"""Console entry points, one module per job: rollout, rescore, audit, verify, bench."""

import os
import sys
import time


def default_log_missing(prog: str, log: str) -> bool:
    """True, after a one-line error on stderr, when `log` is bi-rollout's default output
    (what a reading command opens when given no LOG) and no such file is here."""
    from bi_rl.rollout.run import DEFAULT_OUT

    if log != DEFAULT_OUT or os.path.exists(log):
        return False
    print(
        f"{prog}: error: no LOG given and {DEFAULT_OUT} (bi-rollout's default output) is "
        "not here; run bi-rollout first or pass a log",
        file=sys.stderr,
    )
    return True


def settings_refused(prog: str) -> bool:
    """True, after a one-line error on stderr, where a BI_RL_* setting that chooses how a model
    runs has a value it does not take (BI_RL_CONCAT_PROJECTIONS, BI_RL_ATTN_SPLIT,
    BI_RL_HOPPER_FILL, BI_RL_HOPPER_DECODE_COLUMNS, BI_RL_HOPPER_PINGPONG; the others are on
    unless "0"): checked before any work or output, by every command that runs a model."""
    from bi_rl._split import split_keys
    from bi_rl.concat import chosen_sets

    try:
        chosen_sets()
        split_keys()
        # (the Hopper dispatcher's module only where one of its BI_RL_HOPPER* settings is
        # set: a command that sets none does not pay for importing it)
        if any(name.startswith("BI_RL_HOPPER") for name in os.environ):
            from bi_rl.backends.cuda import hopper, hopper_attention

            hopper.check_settings()
            hopper_attention.pingpong_enabled()
    except ValueError as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return True
    return False


def add_sampling_args(group, seed_help: str = "sampling seed") -> None:
    """--temperature, --top-p, --top-k, --min-p and --seed, as bi-rollout and bi-train take
    them (`sampler_config` turns them into the keyed sampler's settings)."""
    from bi_rl.rollout.sampler import (
        DEFAULT_MIN_P,
        DEFAULT_SEED,
        DEFAULT_TEMPERATURE,
        DEFAULT_TOP_K,
        DEFAULT_TOP_P,
    )

    group.add_argument(
        "--temperature",
        type=float,
        default=DEFAULT_TEMPERATURE,
        help=f"0 = greedy (default: {DEFAULT_TEMPERATURE})",
    )
    group.add_argument(
        "--top-p",
        type=float,
        default=DEFAULT_TOP_P,
        help=f"nucleus mass (default: {DEFAULT_TOP_P} = off)",
    )
    group.add_argument(
        "--top-k",
        type=int,
        default=DEFAULT_TOP_K,
        help=f"keep the k most likely tokens (default: {DEFAULT_TOP_K} = off)",
    )
    group.add_argument(
        "--min-p",
        type=float,
        default=DEFAULT_MIN_P,
        help=f"keep p >= min_p * p_max (default: {DEFAULT_MIN_P} = off)",
    )
    group.add_argument(
        "--seed",
        type=int,
        default=DEFAULT_SEED,
        help=f"{seed_help}, 0 <= seed < 2^64 (default: {DEFAULT_SEED})",
    )


def sampler_config(args):
    """The SamplerConfig of the options `add_sampling_args` added."""
    from bi_rl.rollout.sampler import SamplerConfig

    return SamplerConfig(
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        min_p=args.min_p,
        seed=args.seed,
    )


class ProgressBar:
    """A one-line progress bar with tokens/s on stderr, drawn only on a terminal."""

    def __init__(self, unit: str = "samples", stream=None, quiet: bool = False):
        self.unit = unit
        self.stream = stream if stream is not None else sys.stderr
        self.quiet = quiet
        self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()
        self.t0 = time.perf_counter()
        self.tokens = 0
        self.last = 0.0
        self.drawn = False

    def update(self, done: int, total: int, tokens: int) -> None:
        """`done` of `total` units finished; `tokens` more tokens processed since the last call."""
        self.tokens += tokens
        now = time.perf_counter()
        if self.quiet or not self.tty or (now - self.last < 0.1 and done < total):
            return
        self.last = now
        width = 24
        filled = width * done // max(total, 1)
        rate = self.tokens / max(now - self.t0, 1e-9)
        bar = "#" * filled + "." * (width - filled)
        line = f"\r[{bar}] {done}/{total} {self.unit}  {self.tokens} tok  {rate:,.0f} tok/s"
        self.stream.write(line)
        self.stream.flush()
        self.drawn = True

    def finish(self) -> None:
        """End the bar's line (before anything else is printed)."""
        if self.drawn:
            self.stream.write("\n")
            self.stream.flush()
            self.drawn = False
