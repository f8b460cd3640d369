"""Compile every CUDA kernel of this backend offline, wrapped exactly as MLX wraps them.

mx.fast.cuda_kernel turns (header, body, inputs, outputs, template) into one translation unit
that NVRTC compiles on the device at first call. This tool writes the same translation units
for representative instantiations and builds them with nvcc for sm_90a, so syntax errors,
register counts and spills show up on a machine without a GPU:

    python -m bi_rl.backends.cuda.compile_check --mlx-include DIR [--verbose] [--only NAME]

DIR holds mlx/backend/cuda/device/*.cuh from MLX's source tree (the headers NVRTC sees).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

import mlx.core as mx

from bi_rl.backends.cuda import attention, gemm, qmm
from bi_rl.backends.cuda._kernels import KernelSpec

CUDA_TYPES = {
    mx.float32: "float",
    mx.float16: "__half",
    mx.bfloat16: "__nv_bfloat16",
    mx.uint32: "uint32_t",
    mx.bool_: "bool",
}


def render(spec: KernelSpec, in_dtypes, ndims, out_dtypes, template, fname: str) -> str:
    """The translation unit MLX 0.32 builds (mlx/backend/cuda/custom_kernel.cpp)."""
    src = [
        '#include "mlx/backend/cuda/device/utils.cuh"\n#include <cooperative_groups.h>\n',
        spec.header(),
        "namespace mlx::core::cu {\n\nnamespace cg = cooperative_groups;\n\n",
        f"__global__ void {fname}(\n",
    ]
    params = []
    for name, dt, nd in zip(spec.inputs, in_dtypes, ndims, strict=True):
        params.append(f"    const {CUDA_TYPES[dt]}* {name}")
        if nd > 0:
            if f"{name}_shape" in spec.source:
                params.append(f"    const __grid_constant__ Shape {name}_shape")
            if f"{name}_strides" in spec.source:
                params.append(f"    const __grid_constant__ Strides {name}_strides")
            if f"{name}_ndim" in spec.source:
                params.append(f"    const __grid_constant__ int {name}_ndim")
    for name, dt in zip(spec.outputs, out_dtypes, strict=True):
        params.append(f"    {CUDA_TYPES[dt]}* {name}")
    src.append(",\n".join(params) + ") {\n")
    for name, val in template:
        if isinstance(val, bool):
            src.append(f"  constexpr bool {name} = {'true' if val else 'false'};\n")
        elif isinstance(val, int):
            src.append(f"  constexpr int {name} = {val};\n")
        else:
            src.append(f"  using {name} = {CUDA_TYPES[val]};\n")
    src += ["\n", spec.source, "\n}\n\n} // namespace mlx::core::cu\n"]
    return "".join(src)


def instances():
    """(label, spec, input dtypes, input ndims, output dtypes, template) to build."""
    for dt in (mx.bfloat16, mx.float16):
        for cfg in (
            gemm.GemmConfig("skinny", mt=1, nt=1, wk=4),
            gemm.GemmConfig("skinny", mt=4, nt=2, wk=8),
            gemm.choose_config(dt, 4096, 4096, 4096),
            gemm.choose_config(dt, 128, 4096, 4096),
        ):
            for has_c in (False, True):
                spec = gemm._spec(cfg.kind, has_c, cfg.shared_memory)
                n_in = 3 if has_c else 2
                yield (
                    f"gemm {cfg} c={has_c} {dt}",
                    spec,
                    [dt] * n_in,
                    [2] * n_in,
                    [dt],
                    gemm._template(dt, cfg, True, has_c, 1.0, 1.0),
                )
        for bits in qmm.BITS:
            for cfg in (
                gemm.choose_config(dt, 1, 4096, 4096),
                gemm.choose_config(dt, 512, 4096, 4096),
            ):
                yield (
                    f"qmm {bits}-bit {cfg} {dt}",
                    qmm._spec(cfg.kind, cfg.shared_memory),
                    [dt, mx.uint32, dt, dt],
                    [2] * 4,
                    [dt],
                    qmm._template(dt, cfg, bits, 64),
                )
    for cfg in (gemm.GemmConfig("f32", mt=1, nt=4), gemm.GemmConfig("f32", mt=8, nt=8)):
        spec = gemm._spec("f32", True, 0)
        yield (
            f"gemm {cfg} f32",
            spec,
            [mx.float32] * 3,
            [2] * 3,
            [mx.float32],
            gemm._template(mx.float32, cfg, False, True, 1.0, 1.0),
        )
    dt = mx.bfloat16
    for d in attention.HEAD_DIMS:
        for cfg in (
            attention.AttnConfig(1, 3 if d <= 96 else 2, False),
            attention.AttnConfig(4, 2, False),
            attention.AttnConfig(1, 2, True),
        ):
            for kind in (
                attention.NO_MASK,
                attention.CAUSAL,
                attention.BOOL_MASK,
                attention.ADDITIVE,
            ):
                has_mask = kind >= attention.BOOL_MASK
                sinks = kind == attention.ADDITIVE
                spec = attention._spec(has_mask, sinks, cfg.split, cfg.shared_memory(d))
                ins = [dt] * 3 + (
                    [mx.bool_ if kind == attention.BOOL_MASK else dt] if has_mask else []
                )
                ins += [dt] if sinks else []
                yield (
                    f"attention D={d} {cfg} mask={kind}",
                    spec,
                    ins,
                    [4] * (3 + has_mask) + ([1] if sinks else []),
                    [mx.float32] if cfg.split else [dt],
                    attention._template(dt, d, cfg, kind, sinks, d**-0.5),
                )
        for kind in (attention.CAUSAL, attention.ADDITIVE):
            has_mask = kind >= attention.BOOL_MASK
            yield (
                f"attention f32 D={d} mask={kind}",
                attention._f32_spec(has_mask, has_mask),
                [mx.float32] * (3 + 2 * has_mask),
                [4] * (3 + has_mask) + ([1] if has_mask else []),
                [mx.float32],
                attention._f32_template(d, kind, has_mask, d**-0.5),
            )
        for sinks in (False, True):
            yield (
                f"attention combine D={d} sinks={sinks}",
                attention._combine_spec(sinks),
                [mx.float32, dt] + ([dt] if sinks else []),
                [3, 4] + ([1] if sinks else []),
                [dt],
                [("T", dt), ("D", d), ("SINKS", sinks)],
            )


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mlx-include", required=True, help="dir holding mlx/backend/cuda/device/")
    p.add_argument("--verbose", action="store_true", help="print ptxas resource usage")
    p.add_argument("--only", default="", help="build only instances whose label contains this")
    args = p.parse_args(argv)
    failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        for i, (label, spec, ins, nds, outs, tmpl) in enumerate(instances()):
            if args.only not in label:
                continue
            path = Path(tmp) / f"k{i}.cu"
            path.write_text(render(spec, ins, nds, outs, tmpl, f"k{i}"))
            cmd = ["nvcc", "-c", "-std=c++17", "-gencode=arch=compute_90a,code=sm_90a"]
            cmd += [f"-I{args.mlx_include}", "-Xptxas", "-v", "-o", str(path.with_suffix(".o"))]
            r = subprocess.run([*cmd, str(path)], capture_output=True, text=True)
            usage = [ln for ln in r.stderr.splitlines() if "registers" in ln or "spill" in ln]
            spills = [ln for ln in usage if "spill" in ln and " 0 bytes spill" not in ln]
            status = "ok" if r.returncode == 0 else "FAILED"
            print(f"{status:6} {label}" + (f"  SPILLS: {spills}" if spills else ""))
            if args.verbose:
                print("       " + "\n       ".join(usage))
            if r.returncode != 0:
                failed += 1
                print(r.stderr[-4000:])
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
