"""MLX's custom-kernel JIT, as seen from outside: the source it builds, the module name it
looks the compiled code up by, and its on-disk cache, so that bi-rl can put code it compiled
itself where MLX will load it.

`mx.fast.cuda_kernel` wraps a kernel body into one translation unit (build_kernel in MLX's
cuda/custom_kernel.cpp), names the compiled module `<kernel name>_<std::hash of that text>`
and, before compiling, looks for `<module>.ptx` (any code the driver loads: PTX or a cubin) and
`<module>.txt` (kernel name, tab, symbol) in its cache directory. MLX compiles for the plain
architecture (sm_90 on Hopper); kernels that need sm_90a (wgmma) are compiled by bi-rl for
sm_90a and written there first, so MLX loads them and launches them with its cheap per-call
path: the source it hashes on every call is a few include lines, where a precompiled launch
hashes the whole cubin (tens of kilobytes) on every call.

Everything here mirrors MLX 0.32 (the version pyproject.toml pins) byte for byte; the GPU tests
run kernels through this path, and a mismatch shows as MLX trying to compile an sm_90a kernel
for sm_90, which fails loudly rather than running different code.
"""

from __future__ import annotations

import os
from pathlib import Path

import mlx.core as mx

from bi_rl.backends.cuda._files import write_atomic

CUDA_TYPES = {
    mx.float32: "float",
    mx.float16: "__half",
    mx.bfloat16: "__nv_bfloat16",
    mx.uint32: "uint32_t",
    mx.int32: "int32_t",
    mx.bool_: "bool",
}
TYPE_STRINGS = {mx.float32: "float", mx.float16: "float16_t", mx.bfloat16: "bfloat16_t"}
DEFAULT_HEADER = (
    '\n#include "mlx/backend/cuda/device/utils.cuh"\n\n#include <cooperative_groups.h>\n\n'
)

# The Shape / Strides structs MLX passes kernels by value (MAX_NDIM = 10 int32 and int64 values),
# as MLX's device header (mlx/backend/cuda/device/utils.cuh) declares them.
SHAPE_STRUCTS = """namespace mlx::core::cu {
template <typename T, int N> struct DimArray {
  T v[N];
  __device__ __forceinline__ T operator[](int i) const { return v[i]; }
};
using Shape = DimArray<int, 10>;
using Strides = DimArray<long long, 10>;
}
"""

# What the translation unit needs from MLX's device headers when bi-rl compiles it: the scalar
# types of its parameters and SHAPE_STRUCTS. Kernels compiled this way use nothing else of MLX's.
STAND_IN_HEADERS = {
    "mlx/backend/cuda/device/utils.cuh": """#pragma once
struct __nv_bfloat16 { unsigned short x; };
struct __half { unsigned short x; };
typedef unsigned int uint32_t;
"""
    + SHAPE_STRUCTS,
    "cooperative_groups.h": "#pragma once\nnamespace cooperative_groups {}\n",
}


def template_suffix(template) -> str:
    """template_arguments_hash(): how template values extend the kernel's name."""
    parts = []
    for _, val in template:
        if isinstance(val, bool):
            parts.append("_t" if val else "_f")
        elif isinstance(val, int):
            parts.append(f"_{val}")
        else:
            parts.append("_" + TYPE_STRINGS[val])
    return "".join(parts)


def kernel_name(name: str, template) -> str:
    return "custom_kernel_" + name + template_suffix(template)


def render(spec, header: str, inputs, out_dtypes, template) -> str:
    """build_kernel(): the translation unit for inputs given as (dtype, ndim) pairs."""
    src = DEFAULT_HEADER + header
    src += "namespace mlx::core::cu {\n\nnamespace cg = cooperative_groups;\n\n"
    src += f"__global__ void {kernel_name(spec.name, template)}(\n"
    for name, (dt, nd) in zip(spec.inputs, inputs, strict=True):
        src += f"    const {CUDA_TYPES[dt]}* {name},\n"
        if nd > 0:
            if f"{name}_shape" in spec.source:
                src += f"    const __grid_constant__ Shape {name}_shape,\n"
            if f"{name}_strides" in spec.source:
                src += f"    const __grid_constant__ Strides {name}_strides,\n"
            if f"{name}_ndim" in spec.source:
                src += f"    const __grid_constant__ int {name}_ndim,\n"
    for i, (name, dt) in enumerate(zip(spec.outputs, out_dtypes, strict=True)):
        last = i == len(spec.outputs) - 1
        src += f"    {CUDA_TYPES[dt]}* {name}" + (") {\n" if last else ",\n")
    return src + constants(template) + spec.source + "\n}\n\n} // namespace mlx::core::cu\n"


def constants(template) -> str:
    """build_kernel(): the lines that open a kernel's body, one a template argument, then an
    empty line (nothing without a template)."""
    if not template:
        return ""
    src = ""
    for name, val in template:
        if isinstance(val, bool):
            src += f"  constexpr bool {name} = {'true' if val else 'false'};\n"
        elif isinstance(val, int):
            src += f"  constexpr int {name} = {val};\n"
        else:
            src += f"  using {name} = {CUDA_TYPES[val]};\n"
    return src + "\n"


def std_hash(data: bytes, seed: int = 0xC70F6907) -> int:
    """libstdc++'s std::hash<std::string> (_Hash_bytes, 64-bit), which names MLX's modules."""
    m64 = (1 << 64) - 1
    mul = (0xC6A4A793 << 32) + 0x5BD1E995

    def mix(v: int) -> int:
        return v ^ (v >> 47)

    n, aligned = len(data), len(data) & ~7
    h = (seed ^ (n * mul)) & m64
    for p in range(0, aligned, 8):
        k = (mix((int.from_bytes(data[p : p + 8], "little") * mul) & m64) * mul) & m64
        h = ((h ^ k) * mul) & m64
    if n & 7:
        h = ((h ^ int.from_bytes(data[aligned:], "little")) * mul) & m64
    return mix((mix(h) * mul) & m64)


def module_name(name: str, template, source: str) -> str:
    return f"{kernel_name(name, template)}_{std_hash(source.encode()):x}"


def _std_temp_dir() -> Path:
    """std::filesystem::temp_directory_path() on POSIX: TMPDIR, TMP, TEMP, TEMPDIR, /tmp."""
    for var in ("TMPDIR", "TMP", "TEMP", "TEMPDIR"):
        val = os.environ.get(var)
        if val:
            return Path(val)
    return Path("/tmp")


def cache_dir() -> Path:
    """ptx_cache_dir(): MLX_PTX_CACHE_DIR, else <temp>/mlx/<MLX version>/ptx."""
    env = os.environ.get("MLX_PTX_CACHE_DIR")
    if env:
        return Path(env)
    return _std_temp_dir() / "mlx" / mx.__version__ / "ptx"


def install(module: str, entry: str, symbol: str, code: bytes) -> Path:
    """Put compiled code where MLX looks for `module`: <module>.txt naming the entry's symbol,
    then <module>.ptx, each written atomically. Raises OSError where the cache is not
    writable."""
    root = cache_dir()
    root.mkdir(parents=True, exist_ok=True)
    path = root / f"{module}.ptx"
    for target, data in ((path.with_suffix(".txt"), f"{entry}\t{symbol}\n".encode()), (path, code)):
        write_atomic(target, data, mode=0o644)
    return path


def installed(module: str, code: bytes) -> bool:
    path = cache_dir() / f"{module}.ptx"
    try:
        return path.read_bytes() == code and path.with_suffix(".txt").is_file()
    except OSError:
        return False
