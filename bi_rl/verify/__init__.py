"""bi-verify's sweep: proves the mode's kernels batch-invariant on this machine, and tests stock
MLX the same way as a control."""

from bi_rl.verify.core import MODE, STOCK, Check
from bi_rl.verify.sweep import plan, run, run_parallel

__all__ = ["MODE", "STOCK", "Check", "plan", "run", "run_parallel"]
