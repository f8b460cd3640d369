"""How the CUDA kernels' source reaches MLX: #include lines naming a content-addressed copy.

These run without a GPU: they check the text MLX will be given (and hash on every call), not
the compiled kernels (tests/test_cuda_*.py run those on the device).
"""

import re
from pathlib import Path

import mlx.core as mx
import pytest
from conftest import load_script

from bi_rl.backends import base
from bi_rl.backends.cuda import _kernels, attention, gemm, qmm


@pytest.fixture
def fresh(monkeypatch, tmp_path):
    """include_root() recomputed under a private temporary directory."""
    monkeypatch.setattr(_kernels.tempfile, "gettempdir", lambda: str(tmp_path))
    _kernels.include_root.cache_clear()
    yield tmp_path
    _kernels.include_root.cache_clear()


def specs():
    yield gemm.kernel_spec("skinny", False, 0)
    yield gemm.kernel_spec("tiled", True, 65536)
    yield gemm.kernel_spec("f32", True, 0)
    yield qmm.kernel_spec("skinny", 0)
    yield attention.kernel_spec(True, True, True, 59520)
    yield attention.combine_spec(True)
    yield attention.f32_spec(True, False)


def test_every_kernel_file_is_in_the_content_addressed_set():
    root = Path(base.__file__).resolve().parents[2] / "kernels"
    on_disk = sorted(
        p.relative_to(root).as_posix() for p in (root / "cuda").rglob("*") if p.is_file()
    )
    copied = set(_kernels.minified_files())
    assert sorted(copied) == on_disk
    for spec in specs():
        assert set(spec.files) <= copied


GENERIC_LAMBDA = re.compile(r"\[[^\]\[]*\]\s*\([^)]*\bauto\b")


def test_no_kernel_uses_a_lambda_with_an_auto_parameter():
    """NVRTC as MLX's CUDA wheel ships it on the H200 refuses a generic lambda in device code
    ("a function without execution space annotations is considered a host function"), while
    a newer NVRTC on a build machine compiles it: so a kernel must use a template function
    instead. The pattern is checked to match one before the sources are scanned."""
    assert GENERIC_LAMBDA.search("auto f = [&](auto tail, int k0) {")
    assert not GENERIC_LAMBDA.search("auto f = [&](int k0) { a[i] = 0; };")
    root = Path(base.__file__).resolve().parents[2] / "kernels"
    found = [
        f"{p.relative_to(root)}:{i}"
        for p in sorted((root / "cuda").rglob("*.cu*"))
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if GENERIC_LAMBDA.search(line)
    ]
    assert not found, f"generic lambdas in kernel sources: {found}"


def test_header_names_files_whose_text_is_the_inline_text(fresh):
    for spec in specs():
        header = spec.header()
        inline = spec.header(inline=True)
        lines = header.splitlines()
        assert len(lines) == len(spec.files)
        texts = []
        for line, name in zip(lines, spec.files, strict=True):
            assert line.startswith('#include "') and line.endswith(f'{name}"')
            path = Path(line[len('#include "') : -1])
            assert path.is_relative_to(fresh)
            texts.append(path.read_text())
        assert "\n".join(texts) == inline
        # what MLX hashes on every call: a few hundred bytes instead of kilobytes
        assert 8 * len(header) < len(inline)


def test_inline_when_asked_or_when_the_copy_cannot_be_written(fresh, monkeypatch):
    spec = gemm.kernel_spec("skinny", False, 0)
    monkeypatch.setenv(_kernels.INLINE_ENV, "1")
    _kernels.include_root.cache_clear()
    assert spec.header() == spec.header(inline=True)
    monkeypatch.delenv(_kernels.INLINE_ENV)

    def refuse(root):
        raise PermissionError("read-only")

    monkeypatch.setattr(_kernels, "materialize", refuse)
    _kernels.include_root.cache_clear()
    with pytest.warns(RuntimeWarning, match="passing them inline"):
        assert spec.header() == spec.header(inline=True)


def test_a_tampered_copy_is_rewritten_and_an_edit_moves_the_path(fresh, monkeypatch):
    root = _kernels.include_root()
    victim = root / "cuda" / "common.cuh"
    victim.write_text("#error stale\n")
    _kernels.include_root.cache_clear()
    assert _kernels.include_root() == root
    assert victim.read_text() == _kernels.minified_files()["cuda/common.cuh"]

    edited = dict(_kernels.minified_files())
    edited["cuda/gemm_skinny.cu"] += "// edited\n"
    monkeypatch.setattr(_kernels, "minified_files", lambda: edited)
    _kernels.include_root.cache_clear()
    moved = _kernels.include_root()
    assert moved != root and moved.parent == root.parent
    assert (moved / "cuda" / "gemm_skinny.cu").read_text().endswith("// edited\n")


def test_offline_builder_reuses_an_inline_build_under_the_include_name(fresh, tmp_path):
    import mlx.core as mx

    offline = load_script("tools/cuda_offline.py")
    spec = gemm.kernel_spec("skinny", False, 0)
    cfg = gemm.GemmConfig("skinny", 1, 1, 1)
    tmpl = gemm.template_args(mx.bfloat16, cfg, False, 1.0, 1.0)
    ins, outs = [(mx.bfloat16, 2)] * 2, [mx.bfloat16]
    name = offline.kernel_name(spec, tmpl)
    inline = offline.mlx_source(spec, ins, outs, tmpl, inline=True)
    old = tmp_path / "old"
    old.mkdir()
    module = f"{name}_{offline.std_hash(inline.encode()):x}"
    (old / f"{module}.ptx").write_bytes(b"cubin bytes")
    (old / f"{module}.txt").write_text("entry\n")
    new = tmp_path / "new"
    assert offline.build_cache([(spec, tuple(ins), tuple(outs), tuple(tmpl))], new, "", 1, old) == 0
    src = offline.mlx_source(spec, ins, outs, tmpl)
    assert '#include "' in src and src != inline
    built = new / f"{name}_{offline.std_hash(src.encode()):x}.ptx"
    assert built.read_bytes() == b"cubin bytes"


def test_a_directory_others_can_write_is_refused(fresh):
    """The copied files become kernel code: a shared-writable directory is not used."""
    import os

    spec = gemm.kernel_spec("skinny", False, 0)
    shared = fresh / f"bi_rl-{os.getuid()}"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.warns(RuntimeWarning, match="not a private directory"):
        assert spec.header() == spec.header(inline=True)
    shared.chmod(0o700)
    _kernels.include_root.cache_clear()
    assert spec.header().startswith(f'#include "{shared}/kernels-')


@pytest.mark.skipif(
    mx.cuda.is_available(),
    reason="an offline tool: its stand-ins would replace the kernels this GPU process runs",
)
def test_offline_recording_as_a_hopper_gpu_leaves_out_what_bi_rl_builds_itself():
    """--hopper records what MLX compiles on a Hopper GPU: a bf16 linear of 1 and 64 rows
    takes the few-row and wgmma kernels there (bi-rl's NVRTC cache, not MLX's), so nothing is
    recorded, while a float32 linear still is; without --hopper the bf16 ones are too (the
    mma.sync kernels other GPUs run). The patches and the plans made with them are gone after
    the block."""
    from bi_rl import backends
    from bi_rl.backends.cuda import hopper

    offline = load_script("tools/cuda_offline.py")
    available = hopper.available

    def recorded(hopper_gpu):
        offline._Recorder.seen.clear()
        with offline.recording(hopper_gpu) as seen, backends.use(backends.get("cuda")):
            for m, dt in ((1, mx.bfloat16), (64, mx.bfloat16), (8, mx.float32)):
                x, w = mx.ones((m, 64), dt), mx.ones((32, 64), dt)
                mx.eval(gemm.linear(x, w))
            return {k[0].name for k in seen}

    on_hopper, elsewhere = recorded(True), recorded(False)
    assert on_hopper and all("f32" in n for n in on_hopper), on_hopper
    assert any("f32" not in n for n in elsewhere), "the mma.sync kernels are recorded"
    assert hopper.available is available, "the Hopper patches are undone"
    assert not hopper._PLANS and not gemm._PLANS, "no plan holding a stand-in kernel is left"
    assert hopper.prepare.cache_info().currsize == 0, "nor a kernel the stand-in 'installed'"
