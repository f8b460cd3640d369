"""PTX of every Hopper GEMM, quantized GEMM and attention kernel, to prove a kernel refactor
changes nothing (or changes only the kernels it means to).

    PYTHONPATH=. python tools/hopper_ptx.py write OUTDIR
        renders every kernel the dispatchers can pick (`hopper.variants()` with and without c,
        `hopper_qmm.variants(bits)` for each width; the attention kernel for each head dim,
        warpgroup count and mask kind; bf16 and f16) as MLX would and writes the
        PTX NVRTC makes of it (front end only, compute_90a: about half a second a kernel), one
        file per kernel named by its configuration.
    python tools/hopper_ptx.py compare DIR_A DIR_B
        lists the kernels whose PTX differs; exit 0 when none does.

Run `write` once in each tree (a checkout of each side, PYTHONPATH pointing at it), then
`compare`. Byte-identical PTX is identical input to ptxas, so identical SASS: a change that
leaves every kernel's PTX unchanged cannot move a bit or a cycle and needs no device run. A
kernel whose PTX differs needs its SASS compared (`cuobjdump -sass` of the cubin) or the
device's tests. Needs cuda-bindings (NVRTC); no GPU.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path


def render(sp, tmpl, inputs, dtype, tool: str = "hopper_ptx") -> str:
    """The translation unit MLX would compile for one kernel (tools/hopper_sass.py uses it
    too); dtype: the output's, or a tuple of each output's; exits, naming `tool`, where NVRTC
    is not installed."""
    from bi_rl.backends.cuda import mlx_jit, nvrtc

    if nvrtc.nvrtc_module() is None:
        raise SystemExit(f"{tool}: NVRTC is not available (pip install cuda-bindings)")
    outs = list(dtype) if isinstance(dtype, tuple) else [dtype]
    return mlx_jit.render(sp, sp.header(), inputs, outs, tmpl)


def file_stem(label: str) -> str:
    """A kernel's label as a file name (without its suffix)."""
    return re.sub(r"[^A-Za-z0-9=.,_-]+", "_", label)


def _ptx(sp, tmpl, inputs, dtype) -> str:
    from bi_rl.backends.cuda import mlx_jit, nvrtc

    source = render(sp, tmpl, inputs, dtype)
    try:
        return nvrtc.compile_ptx(source, sp.name, headers=mlx_jit.STAND_IN_HEADERS)
    except nvrtc.CompileError as e:
        raise SystemExit(f"hopper_ptx: {sp.name} does not compile: {e}") from None


def kernels():
    """(label, spec, template, input (dtype, ndim) list, output dtype) of every kernel."""
    import mlx.core as mx

    from bi_rl.backends.cuda import attention, hopper, hopper_attention, hopper_qmm

    for dt in (mx.bfloat16, mx.float16):
        for cfg in hopper.variants():
            for has_c in (False, True):
                sp = hopper.cfg_spec(cfg, has_c)
                tmpl = hopper.template(dt, cfg, has_c, 1.0, 1.0)
                outs = hopper.out_dtypes(cfg, dt)
                yield f"{dt} {cfg} c={has_c}", sp, tmpl, [(dt, 2)] * len(sp.inputs), outs
        for bits in hopper_qmm.BITS:
            for cfg in hopper_qmm.variants(bits):
                sp = hopper_qmm.cfg_spec(cfg)
                ins = [(dt, 2), (mx.uint32, 2), (dt, 2), (dt, 2)]
                yield f"{dt} {cfg}", sp, hopper_qmm.template(dt, cfg), ins, dt
        masks = (
            (attention.NO_MASK, None),
            (attention.CAUSAL, None),
            (attention.BOOL_MASK, mx.bool_),
            (attention.ADDITIVE, dt),
        )
        for d in hopper_attention.HEAD_DIMS:
            for nwg in (1, 2):
                for kind, mask_dt in masks:
                    sp = hopper_attention.spec(mask_dt is not None, d, nwg)
                    tmpl = hopper_attention.template(dt, d, kind, 0.125, 0, nwg)
                    ins = [(dt, 4)] * 3 + ([(mask_dt, 4)] if mask_dt is not None else [])
                    yield f"{dt} attention d{d} x{nwg} mask{kind}", sp, tmpl, ins, dt


def write(out: Path) -> int:
    out.mkdir(parents=True, exist_ok=True)
    count = 0
    for label, *args in kernels():
        name = file_stem(label) + ".ptx"
        (out / name).write_text(_ptx(*args))
        count += 1
    print(f"{count} kernels written to {out}")
    return 0


def compare(a: Path, b: Path) -> int:
    names_a = {p.name for p in a.glob("*.ptx")}
    names_b = {p.name for p in b.glob("*.ptx")}
    only = sorted(names_a ^ names_b)
    differ = sorted(n for n in names_a & names_b if (a / n).read_bytes() != (b / n).read_bytes())
    for n in only:
        print(f"only in {a if n in names_a else b}: {n}")
    for n in differ:
        print(f"differs: {n}")
    same = len(names_a & names_b) - len(differ)
    print(f"{same} identical, {len(differ)} differ, {len(only)} in one directory only")
    return 0 if not differ and not only else 1


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = p.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("write", help="write the PTX of every kernel of the tree on PYTHONPATH")
    w.add_argument("out", type=Path)
    c = sub.add_parser("compare", help="list the kernels whose PTX differs between two dirs")
    c.add_argument("a", type=Path)
    c.add_argument("b", type=Path)
    args = p.parse_args(argv)
    if args.cmd == "write":
        return write(args.out)
    for d in (args.a, args.b):
        if not d.is_dir():
            print(f"hopper_ptx: {d} is not a directory", file=sys.stderr)
            return 2
    return compare(args.a, args.b)


if __name__ == "__main__":
    raise SystemExit(main())
