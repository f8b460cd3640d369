# The wgmma attention kernels (NVRTC, sm_90a) the attention GPU tests and bi-bench's attention
# cases instantiate, for the tree this runs in, into $BI_RL_CUDA_CACHE: every dtype, head
# dim, mask form, warpgroup count and the windows the tests use, at scale d^-0.5. Run from
# the tree's root with PYTHONPATH=.
import mlx.core as mx

from bi_rl.backends.cuda import attention as A
from bi_rl.backends.cuda import hopper_attention as H

n = 0
for dt in (mx.bfloat16, mx.float16):
    for d in H.HEAD_DIMS:
        for nwg in (1, 2):
            for kind, mdt in (
                (A.NO_MASK, None),
                (A.CAUSAL, None),
                (A.BOOL_MASK, mx.bool_),
                (A.ADDITIVE, dt),
            ):
                for window in (0, 63, 64, 65, 256):
                    shape = (4, 4, 4) + ((4,) if mdt else ())
                    H.prepare(dt, d, kind, d**-0.5, window, nwg, mdt, shape)
                    n += 1
print(n, "kernels prepared")
