# precompile_main.py's kernels plus the grouped few-row entries (hopper.prepare_group, every
# few-row configuration, 2 and 3 weights), for the fused-proj tree. Run from the tree's root
# with PYTHONPATH=. and $BI_RL_CUDA_CACHE set.
import runpy
import sys
from pathlib import Path

import mlx.core as mx

from bi_rl.backends.cuda import hopper

runpy.run_path(str(Path(__file__).with_name("precompile_main.py")), run_name="__main__")
n = 0
for dt in (mx.bfloat16, mx.float16):
    for cfg in hopper.NARROW:
        for g in hopper.GROUP_SIZES:
            hopper.prepare_group(dt, cfg, g)
            n += 1
print(n, "grouped kernels prepared", file=sys.stderr)
