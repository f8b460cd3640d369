"""How the CUDA wrappers launch their kernels: one `Launch` per kernel call, built once per
argument signature. Checked without a GPU, with the kernel objects replaced by a recorder
that notes each call and returns zeros of the shape asked for (tests/test_cuda_*.py run the
kernels themselves on the device).

Properties: a Launch passes exactly its template, grid, group and output to the kernel and
shows the caller its view of the output; gemm and qmm flatten a 3-D activation into one
(M, K) GEMM and restore the caller's shape; attention in split mode chains its forward
launch into the combine launch; a second call with the same signature builds nothing; head dim
256 runs two column blocks per row group with the query in shared memory; a window bounds the
splits (and the split decision) by the keys a row can see, and a ring adds its key_start input.
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
    # 600 keys: 2 splits of 512, a partial 64 values, the max and the sum
    assert fkw["output_shapes"] == [(4, 2, 66)] and fkw["output_dtypes"] == [mx.float32]
    assert ckw["inputs"][0].shape == (4, 2, 66) and ckw["inputs"][2].dtype == mx.bfloat16
    calls.clear()
    attention.scaled_dot_product_attention(q, k, v, 0.125, mask=mx.ones((600,), mx.bool_))
    ((name, kw),) = calls
    assert name == "bi_attn_m" and kw["inputs"][3].shape == (1, 1, 1, 600)


def test_attention_split_mode_has_a_partial_slot_for_every_split_of_every_block(calls):
    """blocks x splits-per-block partial slots a row (the combine folds them all, skipping
    the empty ones), the grid's y the blocks, SPB in the template; 1500 keys = 3 splits."""
    q = mx.ones((1, 4, 1, 128), mx.bfloat16)
    k = v = mx.ones((1, 2, 1500, 128), mx.bfloat16)
    for spb, blocks in ((1, 3), (2, 2), (8, 1)):
        calls.clear()
        cfg = attention.AttnConfig(1, 2, True, spb)
        attention.scaled_dot_product_attention(q, k, v, 0.1, config=cfg)
        (_, fkw), (_, ckw) = calls
        assert fkw["grid"][1] == blocks and fkw["output_shapes"] == [(4, blocks * spb, 130)]
        assert ("SPB", spb) in fkw["template"] and ckw["inputs"][0].shape == (4, blocks * spb, 130)
    calls.clear()  # sequential mode: one template whatever splits_per_block says
    attention.scaled_dot_product_attention(
        q, k, v, 0.1, config=attention.AttnConfig(1, 2, False, 4)
    )
    ((_, kw),) = calls
    assert ("SPB", 1) in kw["template"] and kw["grid"][1] == 1


def test_attention_head_dim_256_runs_two_column_blocks(calls):
    q = mx.ones((1, 4, 1, 256), mx.bfloat16)
    k = v = mx.ones((1, 2, 600, 256), mx.bfloat16)
    attention.scaled_dot_product_attention(q, k, v, 0.0625)
    ((name, kw),) = calls
    assert name == "bi_attn" and kw["grid"][2] == 2 and ("D", 256) in kw["template"]
    assert attention.q_in_smem(256) and attention.value_cols(256) == 128
    calls.clear()
    attention.scaled_dot_product_attention(q[..., :128], k[..., :128], v[..., :128], 0.1)
    ((name, kw),) = calls
    assert kw["grid"][2] == 1 and not attention.q_in_smem(128)


def test_attention_window_bounds_the_splits_and_a_ring_adds_key_start(calls):
    q = mx.ones((1, 4, 1, 64), mx.bfloat16)
    k = v = mx.ones((1, 2, 40000, 64), mx.bfloat16)
    ks = mx.array([7], mx.int32)
    attention.scaled_dot_product_attention(q, k, v, 0.125)  # 79 splits: split mode
    attention.scaled_dot_product_attention(q, k, v, 0.125, window=36000)  # 71 splits
    attention.scaled_dot_product_attention(q, k, v, 0.125, window=1000, key_start=ks)
    names = [name for name, _ in calls]
    assert names == ["bi_attn_split", "bi_attn_combine", "bi_attn_split", "bi_attn_combine",
                     "bi_attn_r"]  # fmt: skip
    (_, full), _, (_, win), _, (_, rkw) = calls
    assert full["output_shapes"] == [(4, 79, 66)] and ("WINDOW", 0) in full["template"]
    assert win["output_shapes"] == [(4, 71, 66)] and ("WINDOW", 36000) in win["template"]
    assert rkw["grid"][1] == 1 and ("WINDOW", 1000) in rkw["template"]
    assert rkw["inputs"][3] is ks and rkw["output_shapes"] == [(1, 4, 1, 64)]
    calls.clear()
    attention.scaled_dot_product_attention(q, k, v, 0.125, key_start=mx.array([7], mx.int64))
    (name, kw), (comb, _) = calls  # no window: all 40000 keys, split mode
    assert (name, comb) == ("bi_attn_r_split", "bi_attn_combine")
    assert kw["inputs"][3].dtype == mx.int32
    calls.clear()
    q32, k32 = q.astype(mx.float32), k.astype(mx.float32)
    attention.scaled_dot_product_attention(q32, k32, k32, 0.1, "causal", window=5, key_start=ks)
    ((name, kw),) = calls
    assert name == "bi_attn_f32_r" and ("WINDOW", 5) in kw["template"]


def test_attention_takes_the_window_a_windowed_cache_noted_on_its_mask(calls, monkeypatch):
    """A boolean mask noted with its window (bi_rl._mask_window, as the windowed KV caches
    note theirs) is launched with that window: a decode row over 40000 keys with a 1000-key
    window plans the splits of 1000 keys, not 79 splits over every key as the same mask
    unnoted does; a prefill chunk of 64 rows a kv head keeps the wgmma kernel where the
    window leaves out no key (window = keys) and takes the mma.sync kernel one key short of
    that (a first key a row there); a noted mask used at another shape carries nothing."""
    from bi_rl import _mask_window as mask_window
    from bi_rl.backends.composed import window_mask
    from bi_rl.backends.cuda import hopper_attention

    q = mx.ones((1, 4, 1, 64), mx.bfloat16)
    k = mx.ones((1, 2, 40000, 64), mx.bfloat16)
    noted, plain = window_mask(1, 40000, 1000), window_mask(1, 40000, 1000)
    mask_window.note(noted, 1000)
    attention.scaled_dot_product_attention(q, k, k, 0.125, plain)
    attention.scaled_dot_product_attention(q, k, k, 0.125, noted)
    (plain_name, plain_kw), _, (name, kw) = calls
    assert (plain_name, plain_kw["output_shapes"]) == ("bi_attn_m_split", [(4, 79, 66)])
    assert ("WINDOW", 0) in plain_kw["template"]
    assert name == "bi_attn_m" and ("WINDOW", 1000) in kw["template"], "one split, windowed"

    wgmma = []
    monkeypatch.setattr(hopper_attention, "enabled", lambda: True)

    def launch(q, k, v, scale, mask, kind, window, keys_per_split):
        wgmma.append((kind, window))
        return mx.zeros(q.shape, q.dtype)

    monkeypatch.setattr(hopper_attention, "launch", launch)
    q = mx.ones((1, 16, 32, 128), mx.bfloat16)
    kv = mx.ones((1, 8, 300, 128), mx.bfloat16)
    calls.clear()
    for w in (300, 299):
        m = window_mask(32, 300, w)
        mask_window.note(m, w)
        attention.scaled_dot_product_attention(q, kv, kv, 0.1, m)
    assert wgmma == [(attention.BOOL_MASK, 300)], "window = keys: the wgmma kernel, windowed"
    ((name, kw),) = calls
    assert name == "bi_attn_m" and ("WINDOW", 299) in kw["template"], "299: mma.sync"
    calls.clear()
    attention.scaled_dot_product_attention(q, kv[:, :, :299], kv[:, :, :299], 0.1, m[:, 1:])
    assert wgmma[1:] == [(attention.BOOL_MASK, 0)] and not calls, "a slice: no window noted"


def test_attention_decides_the_wgmma_kernel_once_per_signature(calls, monkeypatch):
    """Whether the Hopper wgmma kernel serves a call (hopper_attention.applies, a function of
    the signature) is decided with the plan: a decode step (2 query rows a kv head, under the
    kernel's 64) runs the mma.sync kernel without looking up whether the wgmma path is on (an
    environment read per call); a prefill chunk of 64 rows a kv head (causal or under an
    additive mask, which the kernel reads in q's dtype) takes the wgmma kernel on every call
    while it is on, and the mma.sync kernel, with the same plan, once it is off."""
    from bi_rl.backends.cuda import hopper_attention

    on, asked, wgmma = [True], [], []
    monkeypatch.setattr(hopper_attention, "enabled", lambda: asked.append(1) or on[0])

    def launch(q, k, v, scale, mask, kind, window, keys_per_split):
        assert keys_per_split == 512, "the default split size, passed to the wgmma kernel"
        wgmma.append((kind, None if mask is None else mask.dtype))
        return mx.zeros(q.shape, q.dtype)

    monkeypatch.setattr(hopper_attention, "launch", launch)
    kv = mx.ones((1, 8, 300, 128), mx.bfloat16)
    for _ in range(2):
        attention.scaled_dot_product_attention(mx.ones((1, 16, 1, 128), mx.bfloat16), kv, kv, 0.1)
    assert not asked and not wgmma and [name for name, _ in calls] == ["bi_attn", "bi_attn"]
    q = mx.ones((1, 16, 32, 128), mx.bfloat16)
    mask = mx.zeros((32, 300), mx.float32)
    for _ in range(2):
        attention.scaled_dot_product_attention(q, kv, kv, 0.1, "causal")
        attention.scaled_dot_product_attention(q, kv, kv, 0.1, mask)
    assert len(asked) == 4 and len(calls) == 2, "the wgmma kernel served all four"
    assert wgmma == [(attention.CAUSAL, None), (attention.ADDITIVE, mx.bfloat16)] * 2
    on[0] = False
    attention.scaled_dot_product_attention(q, kv, kv, 0.1, "causal")
    assert len(wgmma) == 4 and [name for name, _ in calls[2:]] == ["bi_attn"], "off: mma.sync"


def test_a_plans_two_attention_kernels_take_the_split_size_it_was_built_with(calls, monkeypatch):
    """The split size (BI_RL_ATTN_SPLIT) is read once with a signature's plan: the mma.sync
    kernel is built for it and the wgmma kernel is launched with it, also after the variable
    changes; a new signature reads it anew."""
    from bi_rl import _split
    from bi_rl.backends.cuda import hopper_attention

    sizes = []
    monkeypatch.setattr(hopper_attention, "enabled", lambda: False)  # mma.sync serves

    def launch(q, *args, keys_per_split):
        sizes.append(keys_per_split)
        return mx.zeros(q.shape, q.dtype)

    monkeypatch.setattr(hopper_attention, "launch", launch)
    monkeypatch.setenv(_split.SPLIT_ENV, "256")
    kv = mx.ones((1, 8, 600, 128), mx.bfloat16)
    q = mx.ones((1, 16, 32, 128), mx.bfloat16)
    attention.scaled_dot_product_attention(q, kv, kv, 0.1, "causal")
    monkeypatch.setenv(_split.SPLIT_ENV, "1024")
    monkeypatch.setattr(hopper_attention, "enabled", lambda: True)  # now the wgmma kernel
    attention.scaled_dot_product_attention(q, kv, kv, 0.1, "causal")
    assert [name for name, _ in calls] == ["bi_attn_k256"] and sizes == [256]
    short = kv[:, :, :500]
    attention.scaled_dot_product_attention(q, short, short, 0.1, "causal")  # a new plan
    assert sizes == [256, 1024]
