"""batch_invariant_mode: routing, restoration, nesting, threads, strictness, compilation."""

from __future__ import annotations

import threading
import warnings

import mlx.core as mx
import mlx.nn as nn
import pytest
from conftest import MARK, bits, cpu_default, differing, marking_backend, rand

import bi_rl
from bi_rl import _stock, backends
from bi_rl.backends import Backend
from bi_rl.mode import _PATCHES


def _symbols():
    return {(id(o), a): getattr(o, a) for o, a, _ in _PATCHES}


def test_every_entry_point_routes_to_the_backend():
    backend, calls = marking_backend()
    x, w, b = rand((3, 16)), rand((8, 16), key=1), rand((8,), key=2)
    q = rand((1, 2, 4, 8), key=3)
    wq, sc, bi = mx.quantize(rand((8, 64), key=4), group_size=32, bits=4)
    xq = rand((3, 64), key=5)
    lin, lin_nb = nn.Linear(16, 8), nn.Linear(16, 8, bias=False)
    qlin = nn.QuantizedLinear(64, 8, bias=True, group_size=32, bits=4)
    experts = rand((3, 16, 8), key=6)  # (expert, K, N)
    wqe, sce, bie = mx.quantize(rand((3, 8, 64), key=7), group_size=32, bits=4)
    idx = mx.array([[2, 0], [1, 1], [0, 2]], dtype=mx.uint32)
    kq = rand((2, 3, 1, 5, 16), key=8)  # (batch, heads, group, keys, dim): a batched k
    with backends.use(backend), bi_rl.batch_invariant_mode():
        outs = {
            "matmul": mx.matmul(x, w.T),
            "@": x @ w.T,
            "addmm": mx.addmm(b, x, w.T),
            "Linear": lin(x),
            "Linear(bias=False)": lin_nb(x),
            "quantized_matmul": mx.quantized_matmul(xq, wq, sc, bi, group_size=32, bits=4),
            "QuantizedLinear": qlin(xq),
            "sdpa": mx.fast.scaled_dot_product_attention(q, q, q, scale=0.5, mask="causal"),
            "batched @": x @ kq.swapaxes(-1, -2),
            "gather_mm": mx.gather_mm(x[:, None, None], experts, rhs_indices=idx),
            "gather_qmm": mx.gather_qmm(
                xq[:, None, None], wqe, sce, bie, rhs_indices=idx, group_size=32, bits=4
            ),
        }
    qmm = _stock.quantized_matmul(xq, wq, sc, bi, group_size=32, bits=4)
    qlin_mm = _stock.quantized_matmul(
        xq, qlin.weight, qlin.scales, qlin.biases, group_size=32, bits=4
    )
    # What the marking backend must have produced for each entry point.
    expected = {
        "matmul": _stock.matmul(x, w.T) + MARK,
        "@": _stock.matmul(x, w.T) + MARK,
        "addmm": _stock.addmm(b, x, w.T) + MARK,
        "Linear": _stock.linear_call(lin, x) + MARK,
        "Linear(bias=False)": _stock.linear_call(lin_nb, x) + MARK,
        "quantized_matmul": qmm + MARK,
        "QuantizedLinear": (qlin_mm + MARK) + qlin.bias,  # the layer adds its bias after
        "sdpa": _stock.scaled_dot_product_attention(q, q, q, scale=0.5, mask="causal") + MARK,
        "batched @": _stock.matmul(x, kq.swapaxes(-1, -2)) + MARK,
        "gather_mm": _stock.gather_mm(x[:, None, None], experts, rhs_indices=idx) + MARK,
        "gather_qmm": _stock.gather_qmm(
            xq[:, None, None], wqe, sce, bie, rhs_indices=idx, group_size=32, bits=4
        )
        + MARK,
    }
    for name, out in outs.items():
        assert differing(out, expected[name]) == 0, f"{name} did not come through the backend"
    assert calls["linear"] == 2 and calls["quantized_matmul"] == 2
    assert (
        calls["matmul"] == 2 and calls["addmm"] == 1 and calls["scaled_dot_product_attention"] == 1
    )
    assert calls["batched_matmul"] == calls["gather_mm"] == calls["gather_qmm"] == 1


def test_mixed_float_dtypes_are_promoted_as_mlx_does_and_stay_on_the_invariant_path():
    # A float32 LoRA adapter on a bfloat16 model: x (bf16) @ lora_a (f32).
    backend, calls = marking_backend()
    x, w = rand((3, 16), mx.bfloat16), rand((16, 8), key=1)
    c, h = rand((3, 8), mx.float16, key=2), rand((16, 8), mx.float16, key=3)
    with backends.use(backend), bi_rl.batch_invariant_mode():
        mm, am = x @ w, mx.addmm(c, x, h)
        lin = bi_rl.linear(x, w.T)
    assert calls["matmul"] == 1 and calls["addmm"] == 1 and calls["linear"] == 1
    assert mm.dtype == am.dtype == lin.dtype == mx.float32
    assert differing(mm, _stock.matmul(x, w) + MARK) == 0
    assert differing(am, _stock.addmm(c, x, h) + MARK) == 0
    assert differing(lin, _stock.matmul(x, w) + MARK) == 0
    # The real CPU backend: stock MLX's promoted product (on a GPU the mode's kernels differ
    # from stock's).
    with cpu_default(), bi_rl.batch_invariant_mode():
        assert differing(x @ w, _stock.matmul(x, w)) == 0


def test_outside_the_mode_everything_is_stock():
    backend, calls = marking_backend()
    with backends.use(backend):
        x = rand((2, 4))
        mx.eval(x @ x.T, nn.Linear(4, 4)(x), mx.matmul(x, x.T))
    assert sum(calls.values()) == 0, "ops routed to the backend outside the mode"


def test_leaving_restores_every_symbol_even_when_the_body_raises():
    before = _symbols()
    with pytest.raises(RuntimeError, match="boom"), bi_rl.batch_invariant_mode():
        assert mx.matmul is not before[(id(mx), "matmul")], "the mode did not patch"
        raise RuntimeError("boom")
    after = _symbols()
    assert after == before, "a patched symbol survived the mode"
    assert mx.matmul is _stock.matmul and nn.Linear.__call__ is _stock.linear_call


def test_nesting_innermost_strictness_wins_and_outer_mode_survives():
    empty = Backend(name="nokernels")
    x = rand((2, 4))
    with backends.use(empty), bi_rl.batch_invariant_mode(strict=True):
        with pytest.raises(NotImplementedError):
            mx.matmul(x, x.T)
        with bi_rl.batch_invariant_mode(strict=False), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out = mx.matmul(x, x.T)  # lax: falls back to stock
        assert differing(out, _stock.matmul(x, x.T)) == 0
        with pytest.raises(NotImplementedError):  # the outer strict mode is back
            mx.matmul(x, x.T)
        assert mx.matmul is not _stock.matmul
    assert mx.matmul is _stock.matmul


def test_strict_mode_names_op_and_backend_for_a_backend_without_kernels():
    cuda_like = Backend(name="cuda")
    x = rand((2, 4))
    with backends.use(cuda_like), bi_rl.batch_invariant_mode():
        with pytest.raises(NotImplementedError, match=r"matmul on the cuda backend"):
            mx.matmul(x, x.T)
        with pytest.raises(NotImplementedError, match=r"scaled_dot_product_attention on the cuda"):
            q = rand((1, 1, 2, 8))
            mx.fast.scaled_dot_product_attention(q, q, q, scale=1.0)


@pytest.mark.parametrize(
    "call",
    [
        lambda a, b: mx.einsum("ij,jk->ik", a, b),
        lambda a, b: mx.tensordot(a, b, axes=1),
        lambda a, b: mx.inner(a, b),
        lambda a, b: mx.conv1d(a[None], b[:, None, :]),
        lambda a, b: mx.block_masked_mm(a, b),
    ],
    ids=["einsum", "tensordot", "inner", "conv1d", "block_masked_mm"],
)
def test_ops_without_invariant_implementation_raise_in_strict_mode(call):
    a, b = rand((4, 4)), rand((4, 4), key=1)
    mx.eval(call(a, b))  # fine outside the mode
    name = bi_rl.active_backend().name
    with bi_rl.batch_invariant_mode(), pytest.raises(NotImplementedError, match=f"{name} backend"):
        call(a, b)


def test_lax_mode_warns_once_per_op_and_falls_back_to_stock():
    a, b = rand((4, 4)), rand((4, 4), key=1)
    from bi_rl import ops

    ops._warned.discard((bi_rl.active_backend().name, "tensordot"))
    reference = mx.tensordot(a, b, axes=1)  # stock, outside the mode
    with bi_rl.batch_invariant_mode(strict=False), warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        outs = [mx.tensordot(a, b, axes=1) for _ in range(3)]
    variant = [w for w in seen if issubclass(w.category, bi_rl.BatchVariantWarning)]
    assert len(variant) == 1 and "tensordot" in str(variant[0].message)
    assert all(differing(out, reference) == 0 for out in outs), "lax fallback is not stock"


def test_mode_is_per_thread():
    """A thread outside the mode runs stock ops while another thread is inside it."""
    backend, calls = marking_backend()
    x = rand((2, 4))
    expected = bits(_stock.matmul(x, x.T))  # evaluated here: MLX streams are per thread
    inside, outside_done = threading.Event(), threading.Event()
    results = {}

    def worker_inside():
        with backends.use(backend), bi_rl.batch_invariant_mode():
            inside.set()
            outside_done.wait(10)
            results["inside"] = bits(x @ x.T)

    def worker_outside():
        inside.wait(10)
        with backends.use(backend):  # same backend, but this thread is not in the mode
            results["outside"] = bits(x @ x.T)
        outside_done.set()

    threads = [threading.Thread(target=worker_inside), threading.Thread(target=worker_outside)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert (results["inside"] != expected).all(), "the thread inside did not use the mode"
    assert (results["outside"] == expected).all(), "the mode leaked into the thread outside it"
    assert calls["matmul"] == 1
    assert mx.matmul is _stock.matmul


def test_compile_inside_the_mode_keeps_one_trace_per_mode_state():
    backend, calls = marking_backend()
    x, w = rand((2, 4)), rand((4, 4), key=1)
    with backends.use(backend):
        with bi_rl.batch_invariant_mode():
            f = mx.compile(lambda a: a @ w)  # mx.compile is bi_rl.compile inside the mode
            assert f.__wrapped__ is not None
            marked = f(x)
        plain = f(x)  # called outside: a stock trace of its own
        with bi_rl.batch_invariant_mode():
            marked_again = f(x)
    assert mx.min(marked).item() > MARK / 2 and mx.min(marked_again).item() > MARK / 2
    assert differing(plain, _stock.matmul(x, w)) == 0


def test_stock_compiled_function_traced_outside_keeps_its_stock_trace_inside():
    """Documented limit: MLX caches traces per function; bi_rl.compile is the fix."""
    backend, _ = marking_backend()
    x, w = rand((2, 4)), rand((4, 4), key=1)
    with backends.use(backend):
        stock_f = _stock.compile(lambda a: a @ w)
        ours = bi_rl.compile(lambda a: a @ w)
        mx.eval(stock_f(x), ours(x))  # both traced outside the mode
        with bi_rl.batch_invariant_mode():
            stale, fresh = stock_f(x), ours(x)
    assert differing(stale, _stock.matmul(x, w)) == 0, "stock trace was expected to be reused"
    assert mx.min(fresh).item() > MARK / 2, "bi_rl.compile did not retrace inside the mode"


def test_direct_calls_outside_the_mode_are_strict():
    x = rand((2, 4))
    with backends.use(Backend(name="metal")), pytest.raises(NotImplementedError, match="metal"):
        bi_rl.matmul(x, x.T)
    # Outside any mode a direct call runs the active backend's invariant op (stock on the CPU,
    # the CUDA kernel on a GPU).
    own = bi_rl.active_backend().ops["matmul"](x, x.T)
    assert differing(bi_rl.matmul(x, x.T), own) == 0


def test_suspended_runs_stock_on_this_thread_and_restores_the_stack():
    from bi_rl import _state

    backend, calls = marking_backend()
    x = rand((2, 4))
    with backends.use(backend), bi_rl.batch_invariant_mode(), bi_rl.batch_invariant_mode(False):
        with pytest.raises(RuntimeError), bi_rl.suspended():
            assert differing(x @ x.T, _stock.matmul(x, x.T)) == 0, "suspended must be stock"
            raise RuntimeError("body fails")
        assert _state.stack() == [True, False], "the mode stack must come back intact"
        mx.eval(x @ x.T)
    assert calls["matmul"] == 1 and not _state.in_mode()


def test_held_keeps_the_wrappers_in_place_but_runs_stock_until_the_mode_is_entered():
    from bi_rl.mode import held

    backend, calls = marking_backend()
    before = _symbols()
    x = rand((2, 4))
    with backends.use(backend), held():
        assert mx.matmul is not _stock.matmul, "held must install the wrappers"
        wrapped = _symbols()
        assert differing(x @ x.T, _stock.matmul(x, x.T)) == 0
        assert sum(calls.values()) == 0, "held alone must not route to the backend"
        with bi_rl.batch_invariant_mode():
            mx.eval(x @ x.T)
        assert calls["matmul"] == 1, "the mode entered inside held must route"
        assert _symbols() == wrapped, "leaving the mode inside held must not restore"
        mx.eval(x @ x.T)
        assert calls["matmul"] == 1, "after leaving the mode the wrappers run stock again"
    assert _symbols() == before, "held must restore every symbol on exit"
    with pytest.raises(RuntimeError, match="boom"), held():
        raise RuntimeError("boom")
    assert _symbols() == before, "held must restore every symbol when the body raises"


class _Block(nn.Module):
    """A layer with a projection and an op the mode has no invariant implementation of."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(4, 4)

    def __call__(self, x):
        return mx.einsum("ij,jk->ik", self.proj(x), x.T)


class _Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = [_Block(), _Block()]

    def __call__(self, x):
        return self.layers[1](self.layers[0](x) @ x)


def test_refusals_name_the_model_layer_and_what_to_do():
    net, x = _Net(), rand((3, 4))
    mx.eval(net(x))  # fine outside the mode
    with bi_rl.batch_invariant_mode(), pytest.raises(NotImplementedError) as e:
        net(x)
    msg = str(e.value)
    assert "einsum" in msg and "in layer layers.0 (_Block)" in msg, msg
    assert "--mode fallback" in msg and "\n" not in msg, "one line, naming what to do"
    # The innermost module wins: a projection refused by a backend without GEMMs.
    refused = pytest.raises(NotImplementedError, match=r"linear .* in layer layers\.0\.proj \(")
    with backends.use(Backend(name="nokernels")), bi_rl.batch_invariant_mode(), refused:
        net(x)
    # Outside any model there is no layer to name.
    with bi_rl.batch_invariant_mode(), pytest.raises(NotImplementedError) as e:
        mx.einsum("ij,jk->ik", x, x.T)
    assert "in layer" not in str(e.value)


def test_lax_warning_names_the_layer():
    from bi_rl import ops

    ops._warned.discard((bi_rl.active_backend().name, "einsum"))
    net, x = _Net(), rand((3, 4))
    with bi_rl.batch_invariant_mode(strict=False), warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        mx.eval(net(x))
    variant = [str(w.message) for w in seen if issubclass(w.category, bi_rl.BatchVariantWarning)]
    assert len(variant) == 1 and "einsum" in variant[0] and "layers.0 (_Block)" in variant[0]
