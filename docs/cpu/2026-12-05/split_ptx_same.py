"""The attention kernels' split constants became `#ifndef BI_ATT_SPLIT` blocks (default 256):
PTX of 26 instantiations (mma.sync with nvcc for sm_90, wgmma with bi-rl's NVRTC for
sm_90a) from the sources as they are now against the same text with the constants written
as before (`constexpr int ATT_SPLIT = 256;`). Run from the repository root, with nvcc:

    python docs/cpu/2026-12-05/split_ptx_same.py
"""

import pathlib
import subprocess
import sys
import tempfile

GUARD = "#ifndef BI_ATT_SPLIT\n#define BI_ATT_SPLIT 256\n#endif\n"
NEW = (
    GUARD + "constexpr int ATT_SPLIT = BI_ATT_SPLIT;",
    GUARD + "constexpr int AT_SPLIT = BI_ATT_SPLIT;",
)
OLD = ("constexpr int ATT_SPLIT = 256;", "constexpr int AT_SPLIT = 256;")


def old_text(src: str) -> str:
    assert any(n in src for n in NEW), "the new constant block is in the source"
    for new, old in zip(NEW, OLD, strict=True):
        src = src.replace(new, old)
    return src


def main() -> None:
    sys.path[:0] = ["tests", "."]
    import mlx.core as mx
    from test_cuda_attention_build import UTILS, half_case

    from bi_rl.backends.cuda import attention as A
    from bi_rl.backends.cuda import hopper_attention as H
    from bi_rl.backends.cuda import mlx_jit, nvrtc

    tmp = pathlib.Path(tempfile.mkdtemp())
    (tmp / "mlx/backend/cuda/device").mkdir(parents=True)
    (tmp / "mlx/backend/cuda/device/utils.cuh").write_text(UTILS)

    def nvcc_ptx(src: str, i: int) -> str:
        f = tmp / f"k{i}.cu"
        f.write_text(src)
        cmd = ["nvcc", "-ptx", "-std=c++17", "-arch=sm_90", f"-I{tmp}"]
        r = subprocess.run([*cmd, "-o", str(f.with_suffix(".ptx")), str(f)], capture_output=True)
        assert r.returncode == 0, r.stderr[-2000:]
        return f.with_suffix(".ptx").read_text()

    same = 0
    for d in (64, 128, 256):
        for cfg in (
            A.AttnConfig(1, 2, False),
            A.AttnConfig(1, 2, True),
            A.AttnConfig(2, 3, True, 16),
        ):
            for kind in (A.CAUSAL, A.BOOL_MASK):
                label, spec, ins, outs, t = half_case(mx.bfloat16, d, cfg, kind, False, False, 0)
                src = mlx_jit.render(spec, spec.header(inline=True), ins, outs, t)
                assert nvcc_ptx(src, 2 * same) == nvcc_ptx(old_text(src), 2 * same + 1), label
                same += 1
    heads = mlx_jit.STAND_IN_HEADERS
    for d in H.HEAD_DIMS:
        for nwg in (1, 2):
            for kind, mdt in ((A.CAUSAL, None), (A.BOOL_MASK, mx.bool_)):
                sp = H.spec(mdt is not None, d, nwg)
                t = H.template(mx.bfloat16, d, kind, 0.088, 0, nwg)
                ins = [(mx.bfloat16, 4)] * 3 + ([(mdt, 4)] if mdt is not None else [])
                src = mlx_jit.render(sp, sp.header(inline=True), ins, [mx.bfloat16], t)
                a = nvrtc.compile_ptx(src, sp.name, "compute_90a", headers=heads)
                b = nvrtc.compile_ptx(old_text(src), sp.name, "compute_90a", headers=heads)
                assert a == b, f"hopper d{d} x{nwg} mask {kind}"
                same += 1
    print(f"default: {same} instantiations, PTX byte for byte as with the constants as before")


if __name__ == "__main__":
    main()
