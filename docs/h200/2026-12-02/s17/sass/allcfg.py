# Registers / spills / static loop stats of every wgmma attention configuration of the tree on
# PYTHONPATH (bf16/f16 x D 64/128 x 4 mask kinds x 1/2 warpgroups). argv[1]: out dir.
import subprocess
import sys
from pathlib import Path

import mlx.core as mx

from bi_rl.backends.cuda import hopper_attention, mlx_jit, nvrtc

out = Path(sys.argv[1])
out.mkdir(parents=True, exist_ok=True)
for dt in (mx.bfloat16, mx.float16):
    for d in (64, 128):
        for mk in range(4):
            for nwg in (1, 2):
                if hopper_attention.shared_memory(d, nwg) > 232448:
                    continue
                sp = hopper_attention.spec(mk >= 2, d, nwg)
                tmpl = hopper_attention.template(dt, d, mk, 0.088, 0, nwg)
                src = mlx_jit.render(sp, sp.header(), [(dt, 4)] * (4 if mk >= 2 else 3), [dt], tmpl)
                entry = "mlx::core::cu::" + mlx_jit.kernel_name(sp.name, tmpl)
                b = nvrtc.compile_cubin(
                    src,
                    sp.name,
                    "sm_90a",
                    headers=mlx_jit.STAND_IN_HEADERS,
                    names=(entry,),
                    label="x",
                )
                tag = f"{'f16' if dt == mx.float16 else 'bf16'}_d{d}_m{mk}_x{nwg}"
                f = out / f"{tag}.cubin"
                f.write_bytes(b.cubin)
                regs = [x for x in b.log.splitlines() if "Used" in x]
                r = subprocess.run(
                    [sys.executable, str(Path(__file__).with_name("sass_ops.py")), "stats", str(f)],
                    capture_output=True,
                    text=True,
                ).stdout
                loop = [x for x in r.splitlines() if "loop" in x]
                print(
                    tag,
                    regs[-1].split(":", 1)[1].strip() if regs else "?",
                    "SPILL" if b.spills else "",
                    loop[0].split(":", 1)[1] if loop else "",
                )
