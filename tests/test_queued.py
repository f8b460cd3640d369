"""bi_rl.score.queued: layers queued as they are built change no bit, and leave the model as
they found it.

Properties: scoring with each decoder layer queued on the device as it is built gives the
logprob bits and fingerprints of scoring each pass as a whole, in strict and off mode,
whole and chunked, for a plain family, the windowed ones (gemma3_text, gpt_oss) and a
quantized one; the guard counts the layers queued (one per layer and forward pass with
queuing on, none with it off). The context restores the body's `layers` child when its body
raises, touches no parameter, runs the armed hook once before the first layer is queued,
and changes nothing where it finds no layer list or is already open.
"""

import mlx.core as mx
import mlx_lm
import numpy as np
import pytest
from mlx.utils import tree_flatten
from tiny_models import build_model

import bi_rl.score.queued as Q
from bi_rl.score.queued import queued_layers
from bi_rl.score.scorer import Item, ScoreConfig, score

CASES = {
    "qwen3": {},
    "gemma3_text": {},
    "gpt_oss": {},
    "qwen3-q4": {"arch": "qwen3", "dtype": "bfloat16", "quantize": 4, "hidden": 64, "heads": 1},
}


def _model(tmp_path, case):
    kw = dict(CASES[case])
    arch = kw.pop("arch", case)
    model, _ = mlx_lm.load(str(build_model(tmp_path / case, arch, **kw)))
    return model


def _items(vocab: int) -> list[Item]:
    rng = np.random.default_rng(4)
    return [
        Item(
            tuple(int(t) for t in rng.integers(4, vocab, n)),
            tuple(int(t) for t in rng.integers(4, vocab, c)),
        )
        for n, c in [(3, 5), (11, 2), (6, 9), (1, 4), (9, 3)]
    ]


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("mode", ["strict", "off"])
@pytest.mark.parametrize("chunk", [None, 4])
def test_queued_layers_give_the_bits_of_one_evaluation(case, mode, chunk, tmp_path, monkeypatch):
    """Every logprob bit and fingerprint is the same with layers queued as built and with
    each pass evaluated whole; the guard: with queuing on, each layer of each forward pass
    was queued, and with it off none was."""
    model = _model(tmp_path, case)
    items = _items(model.args.vocab_size)
    cfg = ScoreConfig(batch_size=2, mode=mode, chunk=chunk)
    pushed = []
    real_push = Q.LayerQueue.push
    monkeypatch.setattr(
        Q.LayerQueue, "push", lambda self, out: pushed.append(1) or real_push(self, out)
    )
    calls = []
    real_call = type(model).__call__
    monkeypatch.setattr(
        type(model), "__call__", lambda self, *a, **k: calls.append(1) or real_call(self, *a, **k)
    )
    queued = score(model, items, cfg)
    assert len(pushed) == len(model.layers) * len(calls) > 0, (len(pushed), len(calls))
    pushed.clear()
    whole = score(model, items, cfg, queue_layers=False)
    assert pushed == []
    for a, b in zip(queued, whole, strict=True):
        assert np.array_equal(a.logprob_bits.view(np.uint32), b.logprob_bits.view(np.uint32))
        assert a.fingerprints == b.fingerprints


def test_the_context_restores_the_layers_and_touches_no_parameter(tmp_path):
    """Inside, `model.layers` are the queued wrappers (their attributes the layers'); after
    the body raises, the body's own list is back and every parameter is the same object."""
    model = _model(tmp_path, "qwen3")
    body = model["model"]
    layers = list(body["layers"])
    params = {k: id(v) for k, v in tree_flatten(model.parameters())}
    with pytest.raises(RuntimeError, match="inside"), queued_layers(model) as queue:
        assert queue is not None
        assert [w._layer for w in model.layers] == layers
        assert model.layers[0].self_attn is layers[0].self_attn
        raise RuntimeError("inside")
    assert "layers" not in vars(body)
    assert model.layers == layers and body["layers"] == layers
    assert {k: id(v) for k, v in tree_flatten(model.parameters())} == params


def test_the_armed_hook_runs_once_before_the_first_layer_is_queued(tmp_path, monkeypatch):
    """arm(before): `before` runs once, before any layer output reaches mx.async_eval."""
    model = _model(tmp_path, "qwen3")
    events = []
    real_async = mx.async_eval
    monkeypatch.setattr(Q.mx, "async_eval", lambda *a: events.append("queue") or real_async(*a))
    with queued_layers(model) as queue:
        queue.arm(lambda: events.append("before"))
        mx.eval(model(mx.array([[5, 6, 7]])))
    assert events == ["before"] + ["queue"] * len(model.layers)
    assert queue.queued == len(model.layers)


def test_nothing_changes_without_a_layer_list_or_inside_an_open_context(tmp_path):
    """A model with no `model.layers` list, a context not enabled and a second context inside
    an open one yield None and leave the layers as they are."""

    class Bare:
        pass

    with queued_layers(Bare()) as queue:
        assert queue is None
    model = _model(tmp_path, "qwen3")
    plain = model.layers
    with queued_layers(model, enabled=False) as off:
        assert off is None and model.layers == plain
    with queued_layers(model) as outer:
        wrapped = model.layers
        with queued_layers(model) as inner:
            assert inner is None and model.layers is wrapped
        assert outer is not None and model.layers is wrapped
