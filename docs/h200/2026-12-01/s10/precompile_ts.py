# NVRTC cubins (BI_RL_CUDA_CACHE) for the Hopper GEMM kernels the few-row GPU tests and the
# narrow ncu table launch, for the tree on PYTHONPATH: the tests run once on the CPU with
# kernels stubbed and hopper.prepare recorded, then each recorded instantiation is compiled.
import os
import sys
import time

sys.path.insert(0, "tests")
sys.path.insert(0, "tools")
import contextlib
from concurrent.futures import ThreadPoolExecutor

import mlx.core as mx
import pytest
import test_cuda_hopper as T

from bi_rl.backends.cuda import hopper

seen = set()
real_prepare = hopper.prepare
hopper.prepare = lambda *a: seen.add(a) or True
hopper.available = lambda: True
stub = lambda **kw: [
    mx.zeros(s, d) for s, d in zip(kw["output_shapes"], kw["output_dtypes"], strict=False)
]
hopper.kernel = lambda spec: stub
mp = pytest.MonkeyPatch()
for dt in (mx.bfloat16, mx.float16):
    for shape in T.SHAPES:
        with contextlib.suppress(AssertionError):
            T.test_every_configuration_and_batch_gives_the_same_bits(dt, shape)
    with contextlib.suppress(AssertionError):
        T.test_activations_of_any_rank_give_the_bits_of_their_rows(dt)
    with contextlib.suppress(AssertionError):
        T.test_operand_forms_and_epilogues(dt)
    for shape in [(100, 65), (2048, 2048), (4096, 264)]:
        with contextlib.suppress(AssertionError):
            T.test_the_few_row_kernel_has_the_wgmma_bits_in_every_form(mp, dt, shape)
mp.undo()
# the ncu table: every few-row configuration and the wgmma pick at M = 1, 8 on the projections
for m in (1, 8):
    for k, n in (
        (2048, 2048),
        (2048, 6144),
        (6144, 2048),
        (2048, 151936),
        (4096, 4096),
        (4096, 14336),
        (14336, 4096),
        (4096, 128256),
    ):
        for cfg in (
            *hopper.NARROW,
            hopper.NARROW_UNPICKED,
            *getattr(hopper, "NARROW_KT2", []),
            hopper.choose_config(m, n, k),
            [c for c in hopper.configs() if not c.narrow][0],
        ):
            seen.add((mx.bfloat16, cfg, False, 1.0, 0.0, False))
            seen.add((mx.bfloat16, cfg, False, 1.0, 0.0, True))
jobs = sorted(seen, key=str)
print(len(jobs), "instantiations", flush=True)
if os.environ.get("DRY"):
    sys.exit(0)
t = time.time()
with ThreadPoolExecutor(int(os.environ.get("JOBS", "2"))) as ex:
    list(ex.map(lambda j: real_prepare(*j), jobs))
print(len(jobs), "compiled in", round(time.time() - t), "s")
