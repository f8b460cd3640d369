"""bi_rl.batch_generate: mlx-lm's call shape, the invariant engine's bits.

Properties: the signature takes every parameter of the installed mlx-lm's batch_generate
in the same order, kind and default (ours add keyword-only ones), and the result is
mlx-lm's own BatchResponse with its field names (both introspected, so a change in mlx-lm
fails here); greedy token ids, texts and logprobs equal mlx-lm's own batch_generate on the
CPU, stop-token rule included (the stop token left out of token_ids and logprobs, a
sequence cut at max_tokens keeping its last token); returned logprobs are bitwise the
scorer's for the same tokens, and a log written with log= rescores through bi-rescore with
0 differences; results do not depend on the decode batch or on where a prompt sits
(keyed by prompt id); a per-prompt max_tokens equals a run at that limit; arguments that
cannot be honoured are refused with one line saying what to pass instead.
"""

import dataclasses
import importlib
import inspect

import mlx.core as mx
import mlx_lm
import numpy as np
import pytest
from conftest import cpu_default
from tiny_models import build_model

import bi_rl
from bi_rl.rollout.generate import GenerateError, batch_generate
from bi_rl.rollout.log import read_log
from bi_rl.score.scorer import Item, ScoreConfig, score

# mlx_lm/__init__.py binds the name `generate` to a function, hiding the module.
mlx_generate = importlib.import_module("mlx_lm.generate")
TEXTS = ["12+34=", "7+8=", "hello there", "a", "99*3=", "abc"]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    path = build_model(tmp_path_factory.mktemp("generate") / "m")
    model, tok = mlx_lm.load(str(path))
    prompts = [tok.encode(t) for t in TEXTS]
    return path, model, tok, prompts


@pytest.fixture
def on_cpu(monkeypatch):
    """mlx-lm's stock batch_generate is batch-invariant on the CPU only: compare there. Its
    generator runs on a stream mlx-lm made at import on the default device of that time (a
    GPU where there is one), so that stream is swapped for the CPU's too."""
    monkeypatch.setattr(mlx_generate, "generation_stream", mx.default_stream(mx.cpu))
    with cpu_default():
        yield


def _bits(xs) -> np.ndarray:
    return np.array(xs, np.float32).view(np.uint32)


def test_signature_and_fields_match_the_installed_mlx_lm():
    theirs = inspect.signature(mlx_generate.batch_generate).parameters
    ours = inspect.signature(batch_generate).parameters
    names = list(ours)
    for i, (name, p) in enumerate(theirs.items()):
        if p.kind is inspect.Parameter.VAR_KEYWORD:
            assert any(q.kind is p.kind for q in ours.values()), "ours must take **kwargs too"
            continue
        assert name in ours, f"mlx-lm's parameter {name!r} is missing"
        assert names.index(name) == i, f"{name!r} must be at position {i}, as in mlx-lm"
        assert ours[name].kind == p.kind, name
        assert ours[name].default == p.default, f"{name!r} default differs from mlx-lm's"
    for name in set(ours) - set(theirs):
        kind = ours[name].kind
        assert kind in (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.VAR_KEYWORD), name
    # mlx-lm's BatchGenerator options pass through its **kwargs; ours names them.
    for name, p in inspect.signature(mlx_generate.BatchGenerator.__init__).parameters.items():
        if name not in ("self", "model", "max_tokens", "stop_tokens"):
            assert name in ours and ours[name].default == p.default, name
    assert bi_rl.batch_generate is batch_generate
    fields = [f.name for f in dataclasses.fields(mlx_generate.BatchResponse)]
    assert fields == ["texts", "stats", "caches", "token_ids", "logprobs"], (
        "guard: the field list this module documents"
    )


def test_greedy_equals_mlx_lm_batch_generate_bit_for_bit(setup, on_cpu):
    _, model, tok, prompts = setup
    ref = mlx_lm.batch_generate(
        model, tok, prompts, max_tokens=9, return_token_ids=True, return_logprobs=True
    )
    got = batch_generate(
        model, tok, prompts, max_tokens=9, return_token_ids=True, return_logprobs=True
    )
    assert type(got) is mlx_generate.BatchResponse
    assert isinstance(got.stats, type(ref.stats))
    assert got.token_ids == ref.token_ids and got.texts == ref.texts
    for a, b in zip(got.logprobs, ref.logprobs, strict=True):
        assert np.array_equal(_bits(a), _bits(b)), "float32 model, T = 1: mlx-lm's bits"
    assert got.caches is None
    bare = batch_generate(model, tok, prompts, max_tokens=9)
    assert bare.token_ids is None and bare.logprobs is None and bare.texts == got.texts


def test_stop_token_rule_follows_mlx_lm(setup, on_cpu):
    _, model, tok, prompts = setup
    first = batch_generate(model, tok, prompts, max_tokens=9, return_token_ids=True)
    counts = {}
    for ids in first.token_ids:
        for t in ids[1:]:
            counts[t] = counts.get(t, 0) + 1
    stop = max(counts, key=counts.get)  # a token some sequences draw after their first
    saved = set(tok.eos_token_ids)
    tok.eos_token_ids = {stop}
    try:
        for limit in (9, 3):
            ref = mlx_lm.batch_generate(
                model, tok, prompts, max_tokens=limit, return_token_ids=True, return_logprobs=True
            )
            got = batch_generate(
                model, tok, prompts, max_tokens=limit, return_token_ids=True, return_logprobs=True
            )
            assert got.token_ids == ref.token_ids and got.texts == ref.texts
            for a, b in zip(got.logprobs, ref.logprobs, strict=True):
                assert np.array_equal(_bits(a), _bits(b))
            stopped = [i for i, ids in enumerate(got.token_ids) if len(ids) < limit]
            assert all(stop not in ids for ids in got.token_ids), "the stop token is left out"
            if limit == 9:
                assert stopped, "guard: some sequence must end on the stop token"
    finally:
        tok.eos_token_ids = saved


def test_logprobs_equal_the_scorer_and_the_log_rescores(setup, tmp_path):
    path, model, tok, prompts = setup
    log = tmp_path / "run.jsonl"
    r = batch_generate(
        model,
        tok,
        prompts,
        max_tokens=7,
        temperature=0.9,
        top_p=0.95,
        seed=3,
        completion_batch_size=4,
        return_token_ids=True,
        return_logprobs=True,
        log=log,
        model_path=path,
    )
    _, records = read_log(log)
    assert [rec.prompt_id for rec in records] == [str(i) for i in range(len(prompts))]
    items = [Item(rec.prompt_tokens, rec.tokens) for rec in records]
    scored = score(model, items, ScoreConfig(batch_size=3, temperature=0.9))
    for rec, s, ids, lps in zip(records, scored, r.token_ids, r.logprobs, strict=True):
        keep = len(ids)
        assert list(rec.tokens[:keep]) == ids
        assert np.array_equal(s.logprob_bits, np.array(rec.logprob_bits, np.uint32))
        assert np.array_equal(_bits(lps), s.logprob_bits[:keep]), "returned = scorer's bits"
    from bi_rl.cli.rescore import main as rescore_main

    assert rescore_main([str(log), "--model", str(path)]) == 0


def test_decode_batch_and_prompt_position_change_no_bit(setup):
    _, model, tok, prompts = setup
    kw = dict(max_tokens=6, temperature=1.0, seed=11, return_token_ids=True, return_logprobs=True)
    ids = [f"q{i}" for i in range(len(prompts))]
    a = batch_generate(model, tok, prompts, prompt_ids=ids, completion_batch_size=1, **kw)
    b = batch_generate(
        model, tok, prompts[::-1], prompt_ids=ids[::-1], completion_batch_size=5, **kw
    )
    assert a.token_ids == b.token_ids[::-1]
    for x, y in zip(a.logprobs, b.logprobs[::-1], strict=True):
        assert np.array_equal(_bits(x), _bits(y))
    c = batch_generate(model, tok, prompts, completion_batch_size=1, **kw)
    assert c.token_ids != a.token_ids, "guard: other prompt ids draw other samples"


def test_per_prompt_max_tokens_equals_a_run_at_that_limit(setup):
    _, model, tok, prompts = setup
    kw = dict(temperature=1.0, seed=5, return_token_ids=True, return_logprobs=True)
    limits = [1, 4, 2, 6, 3, 5]
    mixed = batch_generate(model, tok, prompts, max_tokens=limits, **kw)
    for i, m in enumerate(limits):
        alone = batch_generate(model, tok, prompts, max_tokens=m, **kw)
        assert mixed.token_ids[i] == alone.token_ids[i]
        assert np.array_equal(_bits(mixed.logprobs[i]), _bits(alone.logprobs[i]))
        assert len(mixed.token_ids[i]) <= m


@pytest.mark.parametrize(
    "kwargs, needle",
    [
        ({"sampler": lambda x: x}, "temperature=, top_p=, top_k=, min_p= and seed="),
        ({"logits_processors": [lambda t, x: x]}, "temperature="),
        ({"prompt_caches": [[]]}, "full prompts"),
        ({"return_prompt_caches": True}, "leave it False"),
        ({"max_kv_size": 64}, "rotating"),
        ({"log": "x.jsonl"}, "model_path="),
        ({"mode": "loose"}, "strict"),
        ({"temperature": -1.0}, "temperature"),
        ({"max_tokens": [3, 4]}, "max_tokens"),
        ({"prompt_ids": ["a"] * 6}, "unique"),
    ],
)
def test_refusals_are_one_line_and_say_what_to_pass(setup, kwargs, needle):
    _, model, tok, prompts = setup
    with pytest.raises(GenerateError) as e:
        batch_generate(model, tok, prompts, **{"max_tokens": 2, **kwargs})
    msg = str(e.value)
    assert needle in msg and "\n" not in msg, msg


def test_bad_prompts_and_unknown_arguments(setup):
    _, model, tok, _ = setup
    with pytest.raises(GenerateError, match="tokenizer.encode"):
        batch_generate(model, tok, ["text, not ids"])
    with pytest.raises(GenerateError, match="no tokens"):
        batch_generate(model, tok, [[5], []])
    with pytest.raises(TypeError, match="temp"):
        batch_generate(model, tok, [[5]], temp=0.5)


def test_log_refuses_an_existing_file_and_adapted_weights(setup, tmp_path):
    path, model, tok, prompts = setup
    log = tmp_path / "run.jsonl"
    log.write_bytes(b"precious\n")
    with pytest.raises(GenerateError, match="already exists"):
        batch_generate(model, tok, prompts, max_tokens=2, log=log, model_path=path)
    assert log.read_bytes() == b"precious\n", "an existing file is never touched"
    from mlx_lm.tuner.utils import linear_to_lora_layers

    adapted, _ = mlx_lm.load(str(path))
    linear_to_lora_layers(adapted, 2, {"rank": 2, "scale": 1.0, "dropout": 0.0})
    with pytest.raises(GenerateError, match="LoRA adapters"):
        batch_generate(
            adapted, tok, prompts, max_tokens=2, log=tmp_path / "b.jsonl", model_path=path
        )
    assert not (tmp_path / "b.jsonl").exists()
