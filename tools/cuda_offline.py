"""Build the CUDA backend's kernels on a machine without a GPU, exactly as MLX would.

mx.fast.cuda_kernel wraps (header, body, inputs, outputs, template) into one translation unit
that NVRTC compiles at the first call on the device, seconds per instantiation. This tool
renders the same text (MLX 0.32's custom_kernel.cpp, byte for byte) and builds it with nvcc
for sm_90a, for two jobs:

    python tools/cuda_offline.py check --mlx-include DIR [--only TEXT]
        compile representative instantiations; print registers and any spills.
    python tools/cuda_offline.py cache --mlx-include DIR --out DIR [--workloads ...]
        record every instantiation the named workloads (tests, suite, e2e, bench, verify,
        verify-full, tune, profile) would launch, by running them on the CPU with the kernels
        replaced by a recorder (--hopper: as a Hopper GPU runs them, where bi-rl builds
        the wgmma and few-row kernels itself), then build each one into MLX's kernel cache layout
        (<module>.ptx holding the cubin, <module>.txt naming the entry point). On the device,
        MLX_PTX_CACHE_DIR=DIR makes MLX load these instead of compiling; a missing or stale
        entry is compiled there as usual.

DIR for --mlx-include holds mlx/backend/cuda/device/*.cuh from MLX's source tree. Run it as
a script from the repository root (bi_rl importable, e.g. PYTHONPATH=.): the workloads e2e,
tune and profile import the tools beside it by name.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import struct
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import mlx.core as mx

from bi_rl.backends.cuda import attention, gemm, mlx_jit, qmm


def kernel_name(spec, template) -> str:
    """custom_kernel_<name><template hash>, as MLX spells it (bi_rl's mlx_jit mirrors MLX)."""
    return mlx_jit.kernel_name(spec.name, template)


def mlx_source(spec, inputs, out_dtypes, template, inline: bool | None = None) -> str:
    """build_kernel(): the translation unit for inputs given as (dtype, ndim) pairs."""
    return mlx_jit.render(spec, spec.header(inline), inputs, out_dtypes, template)


std_hash = mlx_jit.std_hash


def elf_section_headers(data: bytes) -> list[tuple]:
    """The section headers of an ELF64 object (a cubin), each as its ten fields: name offset,
    type, flags, address, offset, size, link, info, alignment, entry size."""
    shoff = struct.unpack_from("<Q", data, 0x28)[0]
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    return [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]


def elf_symbols(data: bytes) -> list[str]:
    """Names in the .symtab of an ELF64 object (a cubin)."""
    secs = elf_section_headers(data)
    names = []
    for _, typ, _, _, off, size, link, _, _, entsize in secs:
        if typ != 2:  # SHT_SYMTAB
            continue
        stroff = secs[link][4]
        for o in range(off, off + size, entsize or 24):
            start = stroff + struct.unpack_from("<I", data, o)[0]
            names.append(data[start : data.index(b"\0", start)].decode())
    return names


def nvcc(src: str, mlx_include: str, cubin: bool, tmp: Path, tag: str):
    path = tmp / f"{tag}.cu"
    path.write_text(src)
    out = path.with_suffix(".cubin" if cubin else ".o")
    cmd = ["nvcc", "--cubin" if cubin else "-c", "-std=c++17"]
    cmd += ["-gencode=arch=compute_90a,code=sm_90a", f"-I{mlx_include}", "-Xptxas", "-v"]
    r = subprocess.run([*cmd, "-o", str(out), str(path)], capture_output=True, text=True)
    return r, out


# ---- recording the instantiations a workload launches ----------------------------------------


class _Recorder:
    """Stands in for an mx.fast.cuda_kernel: notes the call, returns zeros of the right shape."""

    seen: dict = {}

    def __init__(self, spec):
        self.spec = spec

    def __call__(self, *, inputs, template, output_shapes, output_dtypes, **_):
        ins = tuple((x.dtype, x.ndim) for x in inputs)
        key = (self.spec, ins, tuple(output_dtypes), tuple(template))
        _Recorder.seen[key] = None
        return [mx.zeros(s, d) for s, d in zip(output_shapes, output_dtypes, strict=True)]


def _quiet(spec):
    """Stands in for a kernel bi-rl builds itself (Hopper, NVRTC): zeros, nothing recorded."""

    def call(*, output_shapes, output_dtypes, **_):
        return [mx.zeros(s, d) for s, d in zip(output_shapes, output_dtypes, strict=True)]

    return call


@contextlib.contextmanager
def recording(hopper_gpu: bool = False):
    """Record the MLX kernels the block launches. hopper_gpu: take the paths a Hopper GPU takes
    (the wgmma GEMM, qmm and attention and the few-row GEMM, which bi-rl compiles with NVRTC
    into a cache of its own), so that only what MLX compiles there is recorded."""
    modules = (gemm, qmm, attention)
    saved = [m.kernel for m in modules]
    cuda_available = mx.cuda.is_available
    for m in modules:
        m.kernel = _Recorder
    mx.cuda.is_available = lambda: True  # let the CUDA tests run their calls
    patched = []
    if hopper_gpu:
        from bi_rl.backends.cuda import hopper, hopper_attention, hopper_qmm

        patched = [(hopper, "available", lambda: True), (hopper, "install", lambda *a: True)]
        patched += [(m, "kernel", _quiet) for m in (hopper, hopper_qmm, hopper_attention)]
        patched = [(m, name, getattr(m, name), new) for m, name, new in patched]
        for m, name, _, new in patched:
            setattr(m, name, new)
    try:
        yield _Recorder.seen
    finally:
        for m, k in zip(modules, saved, strict=True):
            m.kernel = k
        mx.cuda.is_available = cuda_available
        for m, name, old, _ in patched:
            setattr(m, name, old)
        _forget_plans()


def _forget_plans() -> None:
    """Empty the CUDA backend's launch plan tables and cached functions: what was made while
    recording holds the stand-in kernels, or a Hopper kernel "installed" by the stand-in."""
    from bi_rl.backends.cuda import _kernels

    for module in list(sys.modules.values()):
        if getattr(module, "__name__", "").startswith("bi_rl.backends.cuda"):
            for value in list(vars(module).values()):
                if isinstance(value, _kernels.Plans):
                    value.clear()
                elif callable(getattr(value, "cache_clear", None)):
                    value.cache_clear()


# part `suite` of tools/cuda_device_run.sh
SUITE = (
    "test_backend_invariance",
    "test_mode",
    "test_engine",
    "test_scorer",
    "test_logprobs",
    "test_rollouts_golden",
)


def _workload(name: str, root: Path) -> None:
    with contextlib.redirect_stdout(sys.stderr):
        if name in ("tests", "suite"):
            import pytest

            if name == "tests":
                tests = sorted(str(p) for p in (root / "tests").glob("test_cuda_*.py"))
            else:
                tests = [str(root / "tests" / f"{f}.py") for f in SUITE]
            pytest.main(["-q", "-p", "no:cacheprovider", "--tb=no", *tests])
        elif name == "e2e":
            import cuda_e2e

            cuda_e2e.main(["--new-tokens", "2", "--paths", "mode"])
        elif name == "bench":
            from bi_rl.bench import kernels

            for case in (*kernels.gemm_cases(False), *kernels.qmm_cases(False)):
                case.ours()
            for case in kernels.attention_cases(False):
                case.ours()
        elif name == "tune":
            import cuda_tune

            for _, _, fns, _, _ in cuda_tune.cases({"gemm", "qmm", "attn", "large"}):
                for fn in fns.values():
                    fn()
        elif name == "profile":
            import cuda_profile

            for make in cuda_profile.CASES.values():
                make()()
        elif name in ("verify", "verify-full"):
            from bi_rl.verify import MODE
            from bi_rl.verify.sweep import plan, run_one

            full = name == "verify-full"  # the full sweep, model-sized GEMMs as on a GPU
            for label, fn in plan(quick=not full, large=full):
                run_one(label, fn, MODE)


def build_cache(instances, out: Path, mlx_include: str, jobs: int, reuse=None) -> int:
    """Build each instantiation into out; reuse: an older cache whose entries, built from the
    inline form of the same text, are copied instead of compiled again."""
    out.mkdir(parents=True, exist_ok=True)

    def one(item):
        i, (spec, ins, outs, template) = item
        src = mlx_source(spec, ins, outs, template)
        name = kernel_name(spec, template)
        module = f"{name}_{std_hash(src.encode()):x}"
        if (out / f"{module}.ptx").exists():
            return f"cached {module}"
        if reuse is not None:
            inline = mlx_source(spec, ins, outs, template, inline=True)
            old = [reuse / f"{name}_{std_hash(inline.encode()):x}{x}" for x in (".txt", ".ptx")]
            if all(o.exists() for o in old):
                for o in old:
                    (out / f"{module}{o.suffix}").write_bytes(o.read_bytes())
                return f"reused {module}"
        with tempfile.TemporaryDirectory() as tmp:
            r, cubin = nvcc(src, mlx_include, True, Path(tmp), f"k{i}")
            if r.returncode != 0:
                return f"FAILED {name}\n{r.stderr[-3000:]}"
            data = cubin.read_bytes()
        mangled = [s for s in elf_symbols(data) if s.startswith("_Z") and name in s]
        if len(mangled) != 1:
            return f"FAILED {name}: entry symbols {mangled}"
        (out / f"{module}.txt").write_text(f"mlx::core::cu::{name}\t{mangled[0]}\n")
        (out / f"{module}.ptx").write_bytes(data)
        return f"built {module}"

    failed = 0
    with ThreadPoolExecutor(jobs) as pool:
        for msg in pool.map(one, enumerate(instances)):
            failed += msg.startswith("FAILED")
            print(msg, flush=True)
    return failed


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("job", choices=["check", "cache"])
    p.add_argument("--mlx-include", required=True, help="dir holding mlx/backend/cuda/device/")
    p.add_argument("--out", help="cache: the directory to fill (MLX_PTX_CACHE_DIR)")
    p.add_argument("--workloads", default="tests,e2e,bench,verify")
    p.add_argument("--only", default="", help="check: only labels containing this")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    p.add_argument("--reuse", type=Path, help="cache: an older cache built from inline sources")
    p.add_argument(
        "--hopper",
        action="store_true",
        help="cache: only what MLX compiles on a Hopper GPU (there bi-rl builds the wgmma and "
        "few-row kernels itself)",
    )
    args = p.parse_args(argv)
    root = Path(__file__).resolve().parents[1]
    if args.job == "cache":
        from bi_rl import backends

        with recording(args.hopper) as seen, backends.use(backends.get("cuda")):
            for w in args.workloads.split(","):
                _workload(w, root)
                print(f"{w}: {len(seen)} instantiations so far", flush=True)
        failed = build_cache(list(seen), Path(args.out), args.mlx_include, args.jobs, args.reuse)
        return 1 if failed else 0
    failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        for i, (label, spec, ins, outs, template) in enumerate(check_instances()):
            if args.only not in label:
                continue
            r, _ = nvcc(
                mlx_source(spec, ins, outs, template), args.mlx_include, False, Path(tmp), f"k{i}"
            )
            usage = [
                ln.strip() for ln in r.stderr.splitlines() if "registers" in ln or "spill" in ln
            ]
            spills = [u for u in usage if "spill" in u and " 0 bytes spill" not in u]
            print(f"{'ok' if r.returncode == 0 else 'FAILED':6} {label}  {' | '.join(usage)}")
            if spills:
                print(f"       SPILLS: {spills}")
            if r.returncode != 0:
                failed += 1
                print(r.stderr[-4000:])
    return 1 if failed else 0


def check_instances():
    """(label, spec, inputs, output dtypes, template) covering every kernel family."""
    for dt in (mx.bfloat16, mx.float16):
        for cfg in (
            gemm.GemmConfig("skinny", mt=1, nt=1, wk=4),
            gemm.GemmConfig("skinny", mt=4, nt=2, wk=8),
            gemm.choose_config(dt, 4096, 4096, 4096),
            gemm.choose_config(dt, 128, 4096, 4096),
        ):
            for has_c in (False, True):
                spec = gemm.kernel_spec(cfg.kind, has_c, cfg.shared_memory)
                yield (
                    f"gemm {cfg.kind} {cfg.template()} c={has_c} {dt}",
                    spec,
                    [(dt, 2)] * (3 if has_c else 2),
                    [dt],
                    gemm.template_args(dt, cfg, has_c, 1.0, 1.0),
                )
        for bits in qmm.BITS:
            for cfg in (
                gemm.choose_config(dt, 1, 4096, 4096),
                gemm.choose_config(dt, 512, 4096, 4096),
            ):
                yield (
                    f"qmm {bits}-bit {cfg.kind} {dt}",
                    qmm.kernel_spec(cfg.kind, cfg.shared_memory),
                    [(dt, 2), (mx.uint32, 2), (dt, 2), (dt, 2)],
                    [dt],
                    qmm.template_args(dt, cfg, bits),
                )
    for cfg in (gemm.GemmConfig("f32", mt=1, nt=4), gemm.GemmConfig("f32", mt=8, nt=8)):
        yield (
            f"gemm f32 {cfg.template()}",
            gemm.kernel_spec("f32", True, 0),
            [(mx.float32, 2)] * 3,
            [mx.float32],
            gemm.template_args(mx.float32, cfg, True, 1.0, 1.0),
        )
    dt = mx.bfloat16
    for d in attention.HEAD_DIMS:
        for cfg in attention.configs():
            for kind in (attention.CAUSAL, attention.BOOL_MASK, attention.ADDITIVE):
                has_mask, sinks = kind >= attention.BOOL_MASK, kind == attention.ADDITIVE
                ins = [(dt, 4)] * 3 + ([(mx.bool_ if kind == 2 else dt, 4)] if has_mask else [])
                yield (
                    f"attention D={d} {cfg} mask={kind}",
                    attention.kernel_spec(has_mask, sinks, cfg.split, cfg.shared_memory(d)),
                    ins + ([(dt, 1)] if sinks else []),
                    [mx.float32] if cfg.split else [dt],
                    attention.template_args(dt, d, cfg, kind, sinks, d**-0.5),
                )
        for kind in (attention.CAUSAL, attention.ADDITIVE):
            has_mask = kind == attention.ADDITIVE
            yield (
                f"attention f32 D={d} mask={kind}",
                attention.f32_spec(has_mask, has_mask),
                [(mx.float32, 4)] * (3 + has_mask) + ([(mx.float32, 1)] if has_mask else []),
                [mx.float32],
                attention.f32_template_args(d, kind, has_mask, d**-0.5),
            )
        yield (
            f"attention combine D={d}",
            attention.combine_spec(True),
            [(mx.float32, 3), (dt, 4), (dt, 1)],
            [dt],
            attention.combine_template_args(dt, d, True),
        )


if __name__ == "__main__":
    sys.exit(main())
