"""How the CUDA wrappers launch their kernels: one `Launch` per kernel call, built once per
argument signature. Checked without a GPU, with the kernel objects replaced by a recorder
that notes each call and returns zeros of the shape asked for (tests/test_cuda_*.py run the
kernels themselves on the device).

Properties: a Launch passes exactly its template, grid, group and output to the kernel and
shows the caller its view of the output; gemm and qmm flatten a 3-D activation into one
(M, K) GEMM and restore the caller's shape; attention in split mode chains its forward
launch into the combine launch; a second call with the same signature builds nothing.
"""

import mlx.core as mx
import pytest

from bi_rl.backends.cuda import _kernels, attention, gemm, hopper, qmm


class Recorder:
    """Stands in for mx.fast.cuda_kernel's kernel object."""

    def __init__(self, spec, calls):
        self.spec, self.calls = spec, calls

    def __call__(self, **kw):
        self.calls.append((self.spec.name, kw))
        return [
            mx.zeros(s, d) for s, d in zip(kw["output_shapes"], kw["output_dtypes"], strict=True)
        ]


@pytest.fixture
def calls(monkeypatch):
    seen = []
    monkeypatch.setattr(hopper, "available", lambda: False)  # the mma.sync path, on any GPU
    for mod in (gemm, qmm, attention):
        monkeypatch.setattr(mod, "kernel", lambda spec: Recorder(spec, seen))
        monkeypatch.setattr(mod, "_PLANS", _kernels.Plans())
    return seen


def test_a_launch_passes_its_plan_and_shows_its_view():
    seen = []
    launch = _kernels.Launch(
        kernel=lambda **kw: seen.append(kw) or [mx.zeros(kw["output_shapes"][0], mx.float32)],
        template=[("T", mx.float32)],
        grid=(64, 2, 1),
        group=(32, 1, 1),
        out_shape=(6, 4),
        out_dtype=mx.float32,
        out_view=(2, 3, 4),
    )
    a, b = mx.ones((6, 8)), mx.ones((4, 8))
    assert launch(a, b, init_value=7.0).shape == (2, 3, 4)
    (kw,) = seen
    assert kw["inputs"][0] is a and kw["inputs"][1] is b
    assert (kw["template"], kw["grid"], kw["threadgroup"]) == (
        [("T", mx.float32)],
        (64, 2, 1),
        (32, 1, 1),
    )
    assert (kw["output_shapes"], kw["output_dtypes"], kw["init_value"]) == (
        [(6, 4)],
        [mx.float32],
        7.0,
    )
    with pytest.raises(TypeError):
        _kernels.Launch(lambda **kw: None, [], (1, 1, 1), (1, 1, 1), (1,), mx.float32)


def test_gemm_flattens_a_3d_activation_and_builds_its_plan_once(calls):
    x, w, bias = (
        mx.ones((2, 3, 64), mx.bfloat16),
        mx.ones((16, 64), mx.bfloat16),
        mx.ones((16,), mx.bfloat16),
    )
    assert gemm.linear(x, w, bias).shape == (2, 3, 16)
    assert gemm.linear(x, w, bias).shape == (2, 3, 16)
    (name, kw), again = calls
    assert name == "bi_gemm_skinny_c" and again[1]["template"] is kw["template"]
    assert [tuple(a.shape) for a in kw["inputs"]] == [(6, 64), (16, 64), (6, 16)]
    assert kw["output_shapes"] == [(6, 16)] and kw["output_dtypes"] == [mx.bfloat16]
    assert len(gemm._PLANS) == 1


def test_qmm_launches_one_quantized_gemm(calls):
    wq, scales, biases = mx.quantize(mx.ones((32, 128), mx.bfloat16), group_size=64, bits=4)
    x = mx.ones((2, 5, 128), mx.bfloat16)
    assert qmm.quantized_matmul(x, wq, scales, biases).shape == (2, 5, 32)
    ((name, kw),) = calls
    assert name == "bi_qmm_skinny" and ("BITS", 4) in kw["template"]
    assert [tuple(a.shape) for a in kw["inputs"]] == [(10, 128), (32, 16), (32, 2), (32, 2)]


def test_attention_split_mode_chains_forward_into_combine(calls):
    q = mx.ones((1, 4, 1, 64), mx.bfloat16)
    k = v = mx.ones((1, 2, 600, 64), mx.bfloat16)
    split = attention.AttnConfig(1, 2, True)
    out = attention.scaled_dot_product_attention(q, k, v, 0.125, sinks=mx.zeros((4,)), config=split)
    assert out.shape == (1, 4, 1, 64) and out.dtype == mx.bfloat16
    (fwd, fkw), (comb, ckw) = calls
    assert (fwd, comb) == ("bi_attn_s_split", "bi_attn_combine_s")
    assert fkw["output_shapes"] == [(4, 3, 66)] and fkw["output_dtypes"] == [mx.float32]
    assert ckw["inputs"][0].shape == (4, 3, 66) and ckw["inputs"][2].dtype == mx.bfloat16
    calls.clear()
    attention.scaled_dot_product_attention(q, k, v, 0.125, mask=mx.ones((600,), mx.bool_))
    ((name, kw),) = calls
    assert name == "bi_attn_m" and kw["inputs"][3].shape == (1, 1, 1, 600)
