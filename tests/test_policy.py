"""bi_rl.score.policy: value-exact trainer logprobs.

Properties: at the rollout policy, the policy logprobs a loss sees are bitwise the logged
rollout logprobs, so every importance ratio is exactly 1.0 and k1 = k2 = k3 = 0 exactly,
while the gradient is non-zero. Under a backend whose invariant path differs from stock
(a guard checks it does), the value is the invariant path's bits and not stock's, and the
gradient is bitwise stock's. mode "off" is plain stock logprobs. A non-finite stock logprob
yields the invariant value, never NaN.
"""

import mlx.core as mx
import mlx.nn as nn
import mlx_lm
import numpy as np
import pytest
from conftest import cpu_default, relerr
from mlx.utils import tree_flatten, tree_map
from tiny_models import build_model

from bi_rl import _stock, backends, batch_invariant_mode
from bi_rl.backends import Backend
from bi_rl.rollout.engine import Engine, EngineConfig
from bi_rl.rollout.prompts import Prompt
from bi_rl.rollout.sampler import SamplerConfig
from bi_rl.score.policy import (
    invariant_logprobs,
    make_batch,
    policy_logprobs,
    stock_logprobs,
    value_exact,
)
from bi_rl.score.report import compare
from bi_rl.score.scorer import Item

TEMPERATURE = 0.8


@pytest.fixture(scope="module")
def rollout(tmp_path_factory):
    model, tok = mlx_lm.load(str(build_model(tmp_path_factory.mktemp("policy") / "m")))
    rng = np.random.default_rng(0)
    prompts = [
        Prompt(f"p{i}", tuple(int(t) for t in rng.integers(4, 40, n)))
        for i, n in enumerate([1, 3, 6, 11])
    ]
    cfg = EngineConfig(n=2, max_tokens=8, stop_tokens=(9, 20), batch_size=3)
    eng = Engine(model, tok, SamplerConfig(temperature=TEMPERATURE, seed=1), cfg)
    samples = [s for step in eng.generate(prompts) for s in step.ready]
    batch = make_batch([Item(s.prompt_tokens, tuple(s.tokens)) for s in samples])
    return model, samples, batch


def _completion_bits(lp: mx.array, samples) -> list[np.ndarray]:
    """Per sample, the uint32 bits of the logprobs at its completion positions."""
    a = np.array(lp).view(np.uint32)
    return [
        a[i, len(s.prompt_tokens) - 1 : len(s.prompt_tokens) - 1 + len(s.tokens)]
        for i, s in enumerate(samples)
    ]


def _grads(model, loss):
    value, grads = nn.value_and_grad(model, loss)(model)
    mx.eval(value, grads)
    return value, dict(tree_flatten(grads))


def test_ratio_is_exactly_one_and_kl_exactly_zero_with_gradients(rollout):
    model, samples, batch = rollout
    old = mx.array(np.zeros(batch.inputs.shape, np.float32))
    flat = np.zeros(batch.inputs.shape, np.uint32)
    for i, s in enumerate(samples):
        p = len(s.prompt_tokens) - 1
        flat[i, p : p + len(s.tokens)] = s.logprob_bits
    old = mx.array(flat.view(np.float32))
    seen = {}

    def loss(m):
        lp = policy_logprobs(m, batch, TEMPERATURE)
        seen["lp"] = lp
        ratio = mx.exp(lp - old)
        seen["ratio"] = ratio
        return -(ratio * batch.mask).sum() / batch.mask.sum()

    _, grads = _grads(model, loss)
    got = _completion_bits(seen["lp"], samples)
    for s, g in zip(samples, got, strict=True):
        assert np.array_equal(g, np.array(s.logprob_bits, np.uint32)), "value must be the log's"
    ratio = np.array(seen["ratio"])[np.array(batch.mask) > 0]
    assert ratio.size == sum(len(s.tokens) for s in samples)
    assert (ratio.view(np.uint32) == np.float32(1.0).view(np.uint32)).all(), "ratio must be 1"
    rep = compare([np.array(s.logprob_bits, np.uint32) for s in samples], got)
    assert rep.identical and rep.k1_mean == rep.k2_max == rep.k3_max == 0.0
    norms = {k: float(mx.abs(v).max()) for k, v in grads.items()}
    assert sum(v > 0 for v in norms.values()) > len(norms) // 2, "gradients must flow"


def _skewed_backend():
    """A backend whose linear is stock x (1 + 2^-8): an invariant path unlike stock."""

    def linear(x, w, bias=None):
        return _stock.linear(x, w, bias) * (1 + 2**-8)

    def sdpa(q, k, v, scale, mask=None, sinks=None):
        return _stock.scaled_dot_product_attention(q, k, v, scale=scale, mask=mask, sinks=sinks)

    return Backend(
        name="skewed",
        ops={
            "linear": linear,
            "matmul": _stock.matmul,
            "addmm": _stock.addmm,
            "scaled_dot_product_attention": sdpa,
        },
    )


def test_value_from_the_invariant_path_gradient_from_stock(rollout):
    """On the CPU on every machine: the gradient's identity with stock's is a property of the
    graph, checked bit for bit where MLX's backward is reproducible. On a GPU MLX's backward
    of a gather (the embedding's, the rows' gathers) adds by atomics, so two runs of the same
    stock gradient need not agree in their last bits."""
    model, _, batch = rollout
    mask = batch.mask
    with cpu_default(), backends.use(_skewed_backend()):
        inv = invariant_logprobs(model, batch, TEMPERATURE)
        stock = stock_logprobs(model, batch, TEMPERATURE)
        mx.eval(stock)
        assert (np.array(inv).view(np.uint32) != np.array(stock).view(np.uint32)).any(), (
            "guard: the skewed invariant path must differ from stock"
        )
        seen = {}

        def exact_loss(m):
            lp = policy_logprobs(m, batch, TEMPERATURE, invariant=inv)
            seen["lp"] = lp
            return (lp * mask).sum()

        def stock_loss(m):
            return (stock_logprobs(m, batch, TEMPERATURE) * mask).sum()

        _, g_exact = _grads(model, exact_loss)
        _, g_stock = _grads(model, stock_loss)
        # Computed inside the mode (value under stop_gradient): same value.
        with batch_invariant_mode():
            _, g_inside = _grads(
                model, lambda m: (policy_logprobs(m, batch, TEMPERATURE) * mask).sum()
            )
    assert np.array_equal(np.array(seen["lp"]).view(np.uint32), np.array(inv).view(np.uint32))
    for k in g_stock:
        a, b = np.array(g_exact[k]), np.array(g_stock[k])
        assert np.array_equal(a.view(np.uint32), b.view(np.uint32)), f"gradient of {k} differs"
        assert np.array_equal(np.array(g_inside[k]).view(np.uint32), b.view(np.uint32))


def test_mode_off_is_plain_stock(rollout):
    model, _, batch = rollout
    with backends.use(_skewed_backend()):
        off = policy_logprobs(model, batch, TEMPERATURE, mode="off")
        stock = stock_logprobs(model, batch, TEMPERATURE)
        mx.eval(off, stock)
    assert np.array_equal(np.array(off).view(np.uint32), np.array(stock).view(np.uint32))


def test_value_exact_on_arrays():
    x = mx.array([0.5, -1.0, 2.0])
    inv = mx.array([-0.25, -3.0, -7.5])

    def f(x):
        return mx.sum(value_exact(inv, mx.log(mx.sigmoid(x))))

    val, g = mx.value_and_grad(f)(x)
    g_ref = mx.grad(lambda x: mx.sum(mx.log(mx.sigmoid(x))))(x)
    assert float(val) == float(mx.sum(inv))
    assert np.array_equal(np.array(g).view(np.uint32), np.array(g_ref).view(np.uint32))
    out = value_exact(mx.array([-1.5, -2.0]), mx.array([-np.inf, -1.0]))
    assert np.array(out).tolist() == [-1.5, -2.0], "a -inf stock logprob must not make NaN"


def test_the_head_runs_on_the_completion_rows_alone(rollout, monkeypatch):
    """The trainer's logprobs come from a head run on the mask's rows alone (a guard counts
    them): at the completion positions the invariant values are bitwise those of a head over
    every position (the control: the family taken off the list, which runs every row), 0
    elsewhere; the stock gradient of the masked sum, on either path, reaches every weight and
    is within GRAD_TOL (relative) of a float64 reference over every position."""
    import bi_rl.score.policy as P
    import bi_rl.score.scorer as S

    model, samples, batch = rollout
    ran = []
    real = P.head_pieces

    def counting(*args):
        pieces, head = real(*args)
        ran.append(head)
        return pieces, head

    monkeypatch.setattr(P, "head_pieces", counting)
    mask = np.array(batch.mask) > 0

    def measure():
        ran.clear()
        inv = np.array(invariant_logprobs(model, batch, TEMPERATURE))
        # the stock path's gradient, on the CPU: its accuracy is the point, not the device's
        with cpu_default():
            _, grads = _grads(model, lambda m: stock_logprobs(m, batch, TEMPERATURE).sum())
        return inv, grads, list(ran)

    inv, grads, heads = measure()
    assert heads == [int(mask.sum())] * 2 and mask.sum() < mask.size
    assert (inv[~mask] == 0).all()
    monkeypatch.setattr(S, "ROW_HEAD_FAMILIES", frozenset())
    inv_all, grads_all, heads_all = measure()
    assert heads_all == [mask.size] * 2
    assert np.array_equal(inv.view(np.uint32), inv_all.view(np.uint32))
    assert [b.tolist() for b in _completion_bits(mx.array(inv), samples)] == [
        s.logprob_bits for s in samples
    ]
    ref = _float64_masked_grads(model, batch)
    for k, g in grads.items():
        assert np.abs(np.array(g)).max() > 0 or "norm" in k, f"no gradient reaches {k}"
        for path, got in (("read rows", g), ("every row", grads_all[k])):
            err = relerr(got, ref[k])
            assert err <= GRAD_TOL, f"gradient of {k} ({path}): relative error {err:.2e}"


def test_the_head_in_pieces_gives_the_same_values_and_an_accurate_gradient(rollout, monkeypatch):
    """With the head's output bounded to two rows' elements (as it is to 2**31 elements for
    stock MLX's 32-bit indexing) the mask's rows go through the head in pieces (a guard
    counts them): the invariant values keep every logged bit, and the stock gradient of the
    masked sum stays within GRAD_TOL of the float64 reference."""
    import bi_rl.score.policy as P
    import bi_rl.score.scorer as S

    model, samples, batch = rollout
    monkeypatch.setattr(S, "HEAD_ELEMENTS", 2 * model.args.vocab_size)
    counts = []
    real = P.head_pieces

    def counting(*args):
        pieces, head = real(*args)
        counts.append([p.shape[0] for p in pieces])
        return pieces, head

    monkeypatch.setattr(P, "head_pieces", counting)
    inv = invariant_logprobs(model, batch, TEMPERATURE)
    assert [b.tolist() for b in _completion_bits(inv, samples)] == [s.logprob_bits for s in samples]
    with cpu_default():
        _, grads = _grads(model, lambda m: stock_logprobs(m, batch, TEMPERATURE).sum())
    assert len(counts) == 2 and all(len(c) > 1 and max(c) <= 2 for c in counts), counts
    ref = _float64_masked_grads(model, batch)
    for k, g in grads.items():
        err = relerr(g, ref[k])
        assert err <= GRAD_TOL, f"gradient of {k} (head in pieces): relative error {err:.2e}"


GRAD_TOL = 1e-4  # float32 gradients of the 2-layer model against float64 (seen: up to 3.6e-5)


def _float64_masked_grads(model, batch) -> dict[str, np.ndarray]:
    """The gradient of sum(mask * log_softmax(logits / T)[target]) over every position, with
    the model's weights in float64 on the CPU (the model is restored after)."""
    params = model.parameters()

    def loss(m):
        # float64 exists on the CPU alone: everything here is built under cpu_default
        mask = batch.mask.astype(mx.float64)
        t = mx.array(TEMPERATURE, dtype=mx.float64)
        x = m(batch.inputs) / t
        picked = mx.take_along_axis(x, batch.targets[..., None], axis=-1)[..., 0]
        return ((picked - mx.logsumexp(x, axis=-1)) * mask).sum()

    try:
        with cpu_default():
            model.update(tree_map(lambda p: p.astype(mx.float64), params))
            _, grads = _grads(model, loss)
    finally:
        model.update(params)
    return {k: np.array(v) for k, v in grads.items()}


def test_the_invariant_pass_queues_its_layers_and_keeps_the_logged_bits(rollout, monkeypatch):
    """invariant_logprobs queues each decoder layer as it is built (a guard counts them: one
    per layer) and its values are still bitwise the logged logprobs; the differentiable
    stock pass queues none (it may run under a gradient transformation)."""
    import bi_rl.score.queued as Q

    model, samples, batch = rollout
    pushed = []
    real = Q.LayerQueue.push
    monkeypatch.setattr(Q.LayerQueue, "push", lambda self, out: pushed.append(1) or real(self, out))
    inv = invariant_logprobs(model, batch, TEMPERATURE)
    assert len(pushed) == len(model.layers) > 0
    assert [b.tolist() for b in _completion_bits(inv, samples)] == [s.logprob_bits for s in samples]
    pushed.clear()
    mx.eval(stock_logprobs(model, batch, TEMPERATURE))
    assert pushed == []
