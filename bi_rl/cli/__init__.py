"""Console entry points, one module per job: rollout, rescore, audit, verify, bench."""

import os
import sys


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
