"""Kernel objects of the CUDA backend, built once per spec, and the launch plans that call them.

A `KernelSpec` names the kernel-source files (kernels/cuda/*.cu[h]) that form the header, the
function body that calls into them, and the inputs and outputs. Dtypes, tile configurations
and scalar constants are template arguments; `kernel(spec)` gives a `SpecKernel`, and a
`Launch` bakes its template into the body once (`bake`: the translation unit MLX would build
from the spec and template, byte for byte), so each instantiation is one cached
`mx.fast.cuda_kernel`, compiled once, and MLX formats no template argument on any call. All
kernels read strides themselves (ensure_row_contiguous=False): a W.T view or a sliced KV
cache is read in place. A `Launch` is one call of one kernel with everything that depends only
on the argument signature (template, grid, output shape); each op wrapper keeps its launches in
a `Plans` table.

Kernel text by reference. MLX assembles the whole translation unit (header + body) into a
new string and hashes it on every call, so the header's length is host time on the decode
path. The header is therefore a few `#include` lines naming a content-addressed copy of the
(minified) kernel files, which NVRTC reads when it compiles an instantiation. The copy is
written once to <tmp>/bi_rl-<uid>/kernels-<digest>/, a directory only this user can write
(the files become code in this process's kernels). The digest of the files is in the path,
so an edited kernel is a new source text (MLX's on-disk kernel cache never serves a stale
build), and the same files give the same path and module names on every machine where the
user id is the same, so that cache can be prebuilt elsewhere (tools/cuda_offline.py). Where
the copy cannot be written, or BI_RL_CUDA_INLINE_SOURCE=1, the text is passed inline; both
forms compile the identical text. docs/cuda-design.md has the measured host costs.
"""

from __future__ import annotations

import os
import struct
import tempfile
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import cache, lru_cache
from pathlib import Path

import mlx.core as mx

from bi_rl import _split
from bi_rl._source import digest, kernel_files, kernel_source
from bi_rl.backends.base import Unsupported
from bi_rl.backends.cuda import mlx_jit
from bi_rl.backends.cuda._files import write_atomic


@dataclass(frozen=True)
class KernelSpec:
    name: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    files: tuple[str, ...]  # kernel source files under kernels/, concatenated as the header
    source: str  # the kernel function's body
    shared_memory: int = 0
    # MLX copies any input that is not row-contiguous before the launch (a no-op for those that
    # are), so the body may read every input as dense row-major, whatever its rank.
    row_contiguous: bool = False
    # "NAME VALUE" macros defined before the kernel files (none: the header as it always was)
    defines: tuple[str, ...] = ()

    def header(self, inline: bool | None = None) -> str:
        """The kernel text, or #include lines naming its on-disk copy (see the module doc),
        after the spec's #define lines."""
        root = None if inline else include_root()
        head = "".join(f"#define {d}\n" for d in self.defines)
        if root is None:
            return head + "\n".join(minify(kernel_source(f)) for f in self.files)
        return head + "".join(f'#include "{root / f}"\n' for f in self.files)


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


INLINE_ENV = "BI_RL_CUDA_INLINE_SOURCE"


def split_defines(keys: int) -> tuple[str, ...]:
    """The KernelSpec defines of a split size (bi_rl._split): none for the default (the kernel
    files' own)."""
    return () if keys == _split.KEYS_PER_SPLIT else (f"BI_ATT_SPLIT {keys}",)


@cache
def minified_files() -> dict[str, str]:
    """Every CUDA kernel file (kernels/cuda/*), minified, by its path under the kernel root."""
    return {f: minify(kernel_source(f)) for f in kernel_files() if f.startswith("cuda/")}


def files_digest() -> str:
    return digest((name, text.encode()) for name, text in minified_files().items())


@cache
def include_root() -> Path | None:
    """The directory NVRTC includes the kernel files from; None: pass them inline."""
    if os.environ.get(INLINE_ENV, "") not in ("", "0"):
        return None
    tmp = Path(tempfile.gettempdir())
    try:
        root = private_dir(tmp) / f"kernels-{files_digest()}"
        if '"' in str(root) or "\n" in str(root):  # it could not be named in an #include
            return None
        materialize(root)
    except OSError as e:
        warnings.warn(
            f"bi_rl: cannot write the CUDA kernel sources under {tmp} ({e}); passing them "
            "inline, which costs host time on every kernel call",
            RuntimeWarning,
            stacklevel=2,
        )
        return None
    return root


def private_dir(tmp: Path) -> Path:
    """<tmp>/bi_rl-<uid>, created 0700 and refused unless this user owns it and no one else
    can write it: the files in it become code in this process's kernels, so another user
    must not be able to replace them between the check and the compile."""
    uid = os.getuid() if hasattr(os, "getuid") else None
    path = tmp / ("bi_rl" if uid is None else f"bi_rl-{uid}")
    path.mkdir(mode=0o700, exist_ok=True)
    st = path.lstat()
    if uid is not None and (st.st_uid != uid or st.st_mode & 0o022 or path.is_symlink()):
        raise PermissionError(f"{path} is not a private directory of this user")
    return path


def materialize(root: Path) -> None:
    """Write the minified kernel files under root, atomically, checking any copy already there."""
    for name, text in minified_files().items():
        path = root / name
        try:
            if path.read_text() == text:
                continue
        except (FileNotFoundError, UnicodeDecodeError):
            pass
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, text.encode(), mode=0o644)


@cache
def _mlx_kernel(spec: KernelSpec):
    return mx.fast.cuda_kernel(
        name=spec.name,
        input_names=list(spec.inputs),
        output_names=list(spec.outputs),
        source=spec.source,
        header=spec.header(),
        ensure_row_contiguous=spec.row_contiguous,
        shared_memory=spec.shared_memory,
    )


def bake(spec: KernelSpec, template) -> KernelSpec:
    """spec with its template arguments written into its body, as the compile-time constants
    MLX writes there for them, under the name MLX gives that instantiation.

    MLX turns (spec, template) into a translation unit whose kernel is named after the
    template's values and whose body starts with one `constexpr` (or `using`) line a template
    argument (build_kernel in MLX's cuda/custom_kernel.cpp; mlx_jit.render mirrors it). From
    (bake(spec, template), no template) it builds the same text byte for byte, so it is the
    same kernel, compiled once and found under the same module name (the kernels bi-rl
    compiles for sm_90a itself included). The difference is host time: a call with template
    arguments has MLX convert, name and format each of them again on every call."""
    if not template:
        return spec
    name = spec.name + mlx_jit.template_suffix(template)
    return replace(spec, name=name, source=mlx_jit.constants(template) + spec.source)


@dataclass(frozen=True)
class SpecKernel:
    """What `kernel(spec)` returns: the spec, made into one MLX kernel object for each template
    it is launched with (`baked`). A `Launch` bakes its template in once, when it is built."""

    spec: KernelSpec

    def baked(self, template) -> Callable:
        """The MLX kernel object of this spec with `template` baked in (call it without one)."""
        return _mlx_kernel(bake(self.spec, template))

    def __call__(self, *, template=(), **kw):
        """A call with its template, as MLX's kernel object takes it (for one-off calls; a
        Launch bakes once instead)."""
        return self.baked(template)(template=[], **kw)


@cache
def kernel(spec: KernelSpec) -> SpecKernel:
    return SpecKernel(spec)


def bound(k: Callable, template: list) -> tuple[Callable, list]:
    """The kernel object to call and the template to pass it: a `SpecKernel` baked with the
    template, with none left to pass; anything else (a test's stand-in) as it is."""
    if isinstance(k, SpecKernel):
        return k.baked(template), []
    return k, template


@dataclass(frozen=True, kw_only=True)
class Launch:
    """One call of one kernel: everything that depends only on the argument signature.

    `out_view` is the shape the caller sees when the kernel writes a flattened
    `out_shape` (a 3-D activation computed as one (M, N) GEMM). `scratch`, (shape, dtype), is
    a second output the kernel writes for itself (the TMA kernels' tensor maps), returned only
    to a caller that asks (`with_scratch`). A `SpecKernel` is baked with the template here,
    once (see `bake`); `spec` then keeps the spec it was made from (None for any other kernel
    object, a test's stand-in).
    """

    kernel: Callable
    template: list
    grid: tuple[int, int, int]
    group: tuple[int, int, int]
    out_shape: tuple[int, ...]
    out_dtype: mx.Dtype
    out_view: tuple[int, ...] | None = None
    scratch: tuple | None = None
    spec: KernelSpec | None = field(default=None, init=False, compare=False, repr=False)

    def __post_init__(self):
        if isinstance(self.kernel, SpecKernel):
            object.__setattr__(self, "spec", self.kernel.spec)
        k, template = bound(self.kernel, self.template)
        object.__setattr__(self, "kernel", k)
        object.__setattr__(self, "template", template)

    def __call__(self, *inputs, init_value=None, with_scratch: bool = False):
        """The output; with_scratch (tests): (output, scratch), to read what the kernel wrote
        for itself."""
        shapes, dtypes = [self.out_shape], [self.out_dtype]
        if self.scratch is not None:
            shapes.append(self.scratch[0])
            dtypes.append(self.scratch[1])
        outs = self.kernel(
            inputs=list(inputs),
            template=self.template,
            grid=self.grid,
            threadgroup=self.group,
            output_shapes=shapes,
            output_dtypes=dtypes,
            init_value=init_value,
        )
        out = outs[0] if self.out_view is None else outs[0].reshape(self.out_view)
        return (out, outs[1] if self.scratch is not None else None) if with_scratch else out


# The TMA kernels' scratch output (kernels/cuda/hopper/tma.cuh, tmap_slot): 256 bytes of
# tensor maps a block and 128 bytes more for the kernel to align their start, as uint32 words.
MAPS_DTYPE = mx.uint32


def tma_maps_words(blocks: int) -> int:
    """uint32 words of a TMA launch's maps output over `blocks` blocks."""
    return 64 * blocks + 32


def attn_shape_source(namespace: str, has_mask: bool) -> str:
    """Kernel-body lines that fill `<namespace>::AttnShape S` (attention_common.cuh, or the
    Hopper kernel's copy) from the shape and stride arguments MLX passes for q, k, v and, with
    has_mask, the 4-D mask: the start of every attention kernel's body."""
    body = f"""
  {namespace}::AttnShape S;
  S.B = q_shape[0]; S.Hq = q_shape[1]; S.Tq = q_shape[2];
  S.Hkv = k_shape[1]; S.Tk = k_shape[2]; S.R = S.Hq / S.Hkv; S.W = WINDOW;
  for (int d = 0; d < 4; ++d) {{
    S.qs[d] = q_strides[d]; S.ks[d] = k_strides[d]; S.vs[d] = v_strides[d];
    S.mshape[d] = 1; S.ms[d] = 0;
  }}
"""
    if has_mask:
        body += (
            "  for (int d = 0; d < 4; ++d) { S.mshape[d] = mask_shape[d]; "
            "S.ms[d] = mask_strides[d]; }\n"
        )
    return body


class Plans(dict):
    """Launch plans by argument signature, each built once. A call looks its plan up with
    `plans.get(sig)` (the decode path's only per-call bookkeeping) and builds it on a miss;
    a stream of ever-new shapes clears the table rather than growing it without bound."""

    LIMIT = 4096

    def build(self, sig, make, *args):
        plan = make(*args)
        if len(self) > self.LIMIT:
            self.clear()
        self[sig] = plan
        return plan


def rows(shape) -> int:
    """The product of all but the last dimension: the M of a GEMM on a (..., K) operand."""
    m = 1
    for s in shape[:-1]:
        m *= s
    return m


def gemm_dims(a, b, b_kn: bool, c, dtypes, where: str = "") -> tuple[int, int, int]:
    """(M, N, K) of a (..., K) times b, (K, N) if b_kn else (N, K), after the checks every GEMM
    path makes: Unsupported for a dtype outside `dtypes`, mixed dtypes, a batched b, a scalar
    a or an empty dimension; ValueError for shapes that do not agree. `where` names the path."""
    dt = a.dtype
    if dt not in dtypes:
        raise Unsupported(f"matmul dtype {dt}{where}")
    if b.dtype != dt or (c is not None and c.dtype != dt):
        raise Unsupported(f"matmul of mixed dtypes {a.dtype}, {b.dtype}")
    if b.ndim != 2:
        raise Unsupported(f"matmul with a {b.ndim}-D weight {tuple(b.shape)}")
    if a.ndim < 1:
        raise Unsupported("matmul of a scalar")
    k = a.shape[-1]
    kb, n = (b.shape[0], b.shape[1]) if b_kn else (b.shape[1], b.shape[0])
    if kb != k:
        raise ValueError(f"matmul shapes {tuple(a.shape)} and {tuple(b.shape)} do not agree")
    m = rows(a.shape)
    if m == 0 or n == 0 or k == 0:
        raise Unsupported(f"matmul with an empty dimension (M={m}, N={n}, K={k})")
    return m, n, k


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
