"""Kernel objects of the CUDA backend: built once per spec, reused for every call.

A `KernelSpec` names the kernel-source files (kernels/cuda/*.cu[h]) that form the header, the
function body that calls into them, and the inputs and outputs. `kernel(spec)` builds the
`mx.fast.cuda_kernel` on first use and caches it; dtypes, tile configurations and scalar
constants travel as template arguments, so MLX compiles each instantiation once and the
Python side rebuilds nothing per call. All kernels read strides themselves
(ensure_row_contiguous=False): a W.T view or a sliced KV cache is read in place.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from functools import cache, lru_cache

import mlx.core as mx

from bi_rl.backends.base import kernel_source


@dataclass(frozen=True)
class KernelSpec:
    name: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    files: tuple[str, ...]  # kernel source files under kernels/, concatenated as the header
    source: str  # the kernel function's body
    shared_memory: int = 0

    def header(self) -> str:
        return "\n".join(minify(kernel_source(f)) for f in self.files)


def minify(text: str) -> str:
    """Kernel source without comments, indentation or blank lines.

    MLX copies and hashes the whole kernel source on every call (custom_kernel.cpp), so its
    length is per-call host time on the decode path. Lines are kept (preprocessor directives
    and #pragma need them); nothing inside a string literal is touched.
    """
    out = []
    for line in text.splitlines():
        code, quoted = [], False
        i = 0
        while i < len(line):
            ch = line[i]
            if ch == '"' and (i == 0 or line[i - 1] != "\\"):
                quoted = not quoted
            elif not quoted and line.startswith("//", i):
                break
            elif not quoted and ch in " \t" and code and code[-1] in " \t":
                i += 1
                continue
            code.append(ch)
            i += 1
        stripped = "".join(code).strip()
        if stripped:
            out.append(stripped)
    return "\n".join(out) + "\n"


@cache
def kernel(spec: KernelSpec):
    return mx.fast.cuda_kernel(
        name=spec.name,
        input_names=list(spec.inputs),
        output_names=list(spec.outputs),
        source=spec.source,
        header=spec.header(),
        ensure_row_contiguous=False,
        shared_memory=spec.shared_memory,
    )


@lru_cache(maxsize=4096)
def float_template(prefix: str, value: float) -> tuple[tuple[str, int], tuple[str, bool]]:
    """A float32 constant as two template arguments: its magnitude's bit pattern and its sign.

    MLX template values are ints and bools; the magnitude keeps the int non-negative (the
    kernel name embeds it). The kernel rebuilds the value with bi::bits_to_float.
    """
    (u,) = struct.unpack("<I", struct.pack("<f", float(value)))
    return (f"{prefix}_BITS", u & 0x7FFFFFFF), (f"{prefix}_NEG", bool(u >> 31))


def cdiv(a: int, b: int) -> int:
    return -(-a // b)
