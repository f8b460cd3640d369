"""Template arguments baked into a kernel's body (`_kernels.bake`), checked without a GPU.

Properties: for every kernel and every template the dispatchers can hand it, MLX builds the
same translation unit, byte for byte, from the baked spec without a template as from the spec
with it (as bi-rl's mirror of MLX's builder, mlx_jit.render, renders both; the GPU tests run
the kernels through that mirror's module names); a Launch bakes its template into the kernel
object once and then calls it with none, one kernel object per spec and template; a test's
stand-in kernel keeps its template; a one-off call of `kernel(spec)` with a template is baked
the same way.
"""

import mlx.core as mx
import pytest

from bi_rl.backends.cuda import (
    _kernels,
    attention,
    gemm,
    hopper,
    hopper_attention,
    hopper_qmm,
    mlx_jit,
    qmm,
    softmax_kernel,
)

HALF = (mx.bfloat16, mx.float16)


def _cases():
    """(label, spec, template) for every kernel the CUDA backend launches, over the
    configurations, dtypes and flags its dispatchers can pick (the scalars at one value: they
    enter the template as an int and a bool like any other)."""
    out = []
    for dt in HALF:
        for d in attention.HEAD_DIMS:
            for cfg in attention.configs():
                for mask in (0, 1, 2, 3):
                    for sinks in (False, True):
                        sp = attention.kernel_spec(
                            mask >= 2, sinks, cfg.split, cfg.shared_memory(d), ring=mask == 1
                        )
                        t = attention.template_args(dt, d, cfg, mask, sinks, 0.088, 4096 * mask)
                        out.append((f"attention {dt} d{d} {cfg} m{mask} s{sinks}", sp, t))
            for sinks in (False, True):
                t = attention.combine_template_args(dt, d, sinks)
                out.append((f"combine {dt} d{d} s{sinks}", attention.combine_spec(sinks), t))
        for d in hopper_attention.HEAD_DIMS:
            for nwg in (1, 2):
                for mask in (0, 1, 2):
                    sp = hopper_attention.spec(mask == 2, d, nwg)
                    t = hopper_attention.template(dt, d, mask, -0.088, 0, nwg)
                    out.append((f"hopper attention {dt} d{d} x{nwg} m{mask}", sp, t))
        for cfg in hopper.variants():
            for has_c in (False, True):
                sp = hopper.cfg_spec(cfg, has_c, nd=True)
                t = hopper.template(dt, cfg, has_c, 1.0, 0.5)
                out.append((f"hopper gemm {dt} {cfg} c{has_c}", sp, t))
        for bits in hopper_qmm.BITS:
            for cfg in hopper_qmm.variants(bits):
                sp = hopper_qmm.cfg_spec(cfg)
                t = hopper_qmm.template(dt, cfg)
                out.append((f"hopper qmm {dt} {cfg}", sp, t))
        cfg = hopper_qmm.pick_narrow(4096, 4)
        sp = hopper_qmm.group_spec(3, cfg.shared_memory, cfg.narrow)
        out.append((f"hopper qmm group {dt}", sp, hopper_qmm.template(dt, cfg)))
        for cfg in gemm.configs(dt):
            sp = gemm.kernel_spec(cfg.kind, True, cfg.shared_memory)
            out.append((f"gemm {dt} {cfg}", sp, gemm.template_args(dt, cfg, True, 1.0, -2.0)))
            sp = qmm.kernel_spec(cfg.kind, cfg.shared_memory)
            out.append((f"qmm {dt} {cfg}", sp, qmm.template_args(dt, cfg, 4)))
    for dt in (*HALF, mx.float32):
        out.append((f"softmax {dt}", softmax_kernel.spec(), [("T", dt)]))
    for sinks in (False, True):
        t = attention.f32_template_args(128, 3, sinks, 0.088, 0)
        out.append((f"attention f32 s{sinks}", attention.f32_spec(True, sinks), t))
    return out


CASES = _cases()


def test_the_cases_cover_every_kind_of_kernel():
    kinds = {label.split(" ")[0] for label, _, _ in CASES}
    assert kinds == {"attention", "combine", "hopper", "gemm", "qmm", "softmax"}
    assert len(CASES) > 500


def test_a_baked_spec_is_the_same_translation_unit():
    """render(bake(spec, t), no template) == render(spec, t) for every case: the same text,
    so the same kernel name, module name and compiled code. (The header goes in ahead of
    what the template changes, as it is, so its #include form stands for the inline one.)"""
    for label, sp, t in CASES:
        header = sp.header()
        ins = [(mx.bfloat16, 2)] * len(sp.inputs)
        outs = [mx.float32] * len(sp.outputs)
        baked = _kernels.bake(sp, t)
        assert baked.name == sp.name + mlx_jit.template_suffix(t), label
        want = mlx_jit.render(sp, header, ins, outs, t)
        assert mlx_jit.render(baked, header, ins, outs, []) == want, label
        assert mlx_jit.module_name(baked.name, [], want) == mlx_jit.module_name(sp.name, t, want)


def test_another_value_baked_is_another_translation_unit():
    """The control of the test above: one template value changed gives another text and
    another name, so the comparison can fail."""
    _, sp, t = next(c for c in CASES if c[0].startswith("hopper qmm"))
    name, val = t[-1]
    other = [*t[:-1], (name, val + 1)]
    ins, outs = [(mx.bfloat16, 2)] * len(sp.inputs), [mx.float32]
    want = mlx_jit.render(sp, sp.header(), ins, outs, t)
    got = mlx_jit.render(_kernels.bake(sp, other), sp.header(), ins, outs, [])
    assert got != want and _kernels.bake(sp, other).name != _kernels.bake(sp, t).name


def test_an_empty_template_bakes_nothing():
    sp = softmax_kernel.spec()
    assert _kernels.bake(sp, []) is sp and mlx_jit.constants([]) == ""


class FakeMLX:
    """Stands in for mx.fast.cuda_kernel: notes each kernel object made and each call."""

    def __init__(self):
        self.made, self.calls = [], []

    def __call__(self, **spec):
        self.made.append(spec)

        def call(**kw):
            self.calls.append((spec["name"], kw))
            shapes, dtypes = kw["output_shapes"], kw["output_dtypes"]
            return [mx.zeros(s, d) for s, d in zip(shapes, dtypes, strict=True)]

        return call


@pytest.fixture
def fake(monkeypatch):
    f = FakeMLX()
    monkeypatch.setattr(mx.fast, "cuda_kernel", f)
    _kernels._mlx_kernel.cache_clear()
    yield f
    _kernels._mlx_kernel.cache_clear()


def test_a_launch_bakes_its_template_once_and_calls_with_none(fake):
    sp = softmax_kernel.spec()
    t = [("T", mx.bfloat16)]
    launches = [
        _kernels.Launch(
            kernel=_kernels.kernel(sp),
            template=t,
            grid=(32, 1, 1),
            group=(32, 1, 1),
            out_shape=(4, 8),
            out_dtype=mx.bfloat16,
        )
        for _ in range(2)
    ]
    (made,) = fake.made  # one kernel object for the spec and template, shared
    assert all(launch.spec is sp for launch in launches)  # what it was made from, unbaked
    assert made["name"] == "bi_softmax_bfloat16_t"
    assert made["source"] == "  using T = __nv_bfloat16;\n\n" + sp.source
    assert made["header"] == sp.header() and made["input_names"] == ["x"]
    x = mx.zeros((4, 8), mx.bfloat16)
    for launch in launches:
        assert launch.template == [] and launch(x).shape == (4, 8)
    assert [kw["template"] for _, kw in fake.calls] == [[], []]
    f16 = _kernels.Launch(
        kernel=_kernels.kernel(sp),
        template=[("T", mx.float16)],
        grid=(32, 1, 1),
        group=(32, 1, 1),
        out_shape=(4, 8),
        out_dtype=mx.float16,
    )
    assert len(fake.made) == 2 and fake.made[-1]["name"] == "bi_softmax_float16_t"
    assert f16.kernel is not launches[0].kernel


def test_a_stand_in_keeps_its_template_and_a_one_off_call_is_baked(fake):
    seen = []
    t = [("T", mx.float32)]
    launch = _kernels.Launch(
        kernel=lambda **kw: seen.append(kw) or [mx.zeros((2,), mx.float32)],
        template=t,
        grid=(1, 1, 1),
        group=(1, 1, 1),
        out_shape=(2,),
        out_dtype=mx.float32,
    )
    launch(mx.zeros((2,)))
    assert seen[0]["template"] == t and not fake.made and launch.spec is None
    sk = _kernels.kernel(softmax_kernel.spec())
    sk(
        inputs=[mx.zeros((2,))],
        template=t,
        grid=(1, 1, 1),
        threadgroup=(1, 1, 1),
        output_shapes=[(2,)],
        output_dtypes=[mx.float32],
    )
    assert fake.made[-1]["name"] == "bi_softmax_float" and fake.calls[-1][1]["template"] == []
