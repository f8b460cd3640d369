# sm_90a cubins of the wgmma prefill attention (bf16, head dim 128, causal, 1 and 2
# warpgroups) from the tree on PYTHONPATH, built by bi-rl's own NVRTC path; argv[1]: out dir.
import sys
from pathlib import Path

import mlx.core as mx

from bi_rl.backends.cuda import attention, hopper_attention, mlx_jit, nvrtc

out = Path(sys.argv[1])
out.mkdir(parents=True, exist_ok=True)
dt = mx.bfloat16
for nwg in (1, 2):
    sp = hopper_attention.spec(False, 128, nwg)
    tmpl = hopper_attention.template(dt, 128, attention.CAUSAL, 0.088, 0, nwg)
    source = mlx_jit.render(sp, sp.header(), [(dt, 4)] * 3, [dt], tmpl)
    entry = "mlx::core::cu::" + mlx_jit.kernel_name(sp.name, tmpl)
    built = nvrtc.compile_cubin(
        source,
        sp.name,
        "sm_90a",
        headers=mlx_jit.STAND_IN_HEADERS,
        names=(entry,),
        label=f"attn x{nwg}",
    )
    (out / f"attn_d128_x{nwg}.cubin").write_bytes(built.cubin)
    print(nwg, built.log.strip().splitlines()[-2:] if built.log else "", built.spills)
