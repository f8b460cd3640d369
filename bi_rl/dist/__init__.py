"""Data parallelism over mx.distributed: more ranks, the same log and the same report.

    world.py     the ranks (joined from mlx.launch / mpirun's environment) and the exact
                 collectives between them (bytes and unsigned integers only), a watchdog
    split.py     which rank does which samples: a pure function of the work and the ranks
    spool.py     finished samples between ranks and on disk before they can join the log
    rollout.py   bi-rollout on many ranks: rank 0 writes the one, byte-identical log
    rescore.py   bi-rescore on many ranks: rank 0 computes the single-process report

This is data parallelism only: every rank holds the whole model. Splitting a model over
devices (tensor parallelism) would change the reduction order inside each matmul, and so
the bits; it is not done here.
"""

from bi_rl.dist.rescore import rescore
from bi_rl.dist.rollout import rollout
from bi_rl.dist.spool import spool_path
from bi_rl.dist.world import (
    DEFAULT_RANK_TIMEOUT,
    EXIT_RANK_LOST,
    DistError,
    Terminated,
    World,
    report_error,
    sigterm_raises,
    stopping,
)

__all__ = [
    "DEFAULT_RANK_TIMEOUT",
    "EXIT_RANK_LOST",
    "DistError",
    "Terminated",
    "World",
    "report_error",
    "rescore",
    "rollout",
    "sigterm_raises",
    "spool_path",
    "stopping",
]
