"""bi_rl.concat: sibling projections computed as one product over concatenated weights change
no bit inside the mode.

Properties: inside the strict mode a concatenated model's logits (a prefill and a cached
decode step, 1, 5 and 12 rows) are bitwise the plain model's (qwen3 and llama, float32 and
bfloat16; 4- and 8-bit qwen3), and a counting backend proves the concatenated product ran
(one product per set and forward, the members' own calls gone); a concatenated product with
one weight changed is caught (the comparison can fail); a part whose arrays were replaced
computes its own product, and a member called with another activation gets it computed
anew; the block puts the members back in their parents, also when it raises, holding row
slices with the bits of their original arrays; outside the mode the parts compute stock
MLX's product; the engine and the scorer with BI_RL_CONCAT_PROJECTIONS=1 give the samples
and scores they give without it.
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import mlx_lm
import numpy as np
import pytest
from conftest import assert_same_bits, bits, counting_backend
from mlx_lm.models.cache import make_prompt_cache
from test_engine import _assert_same, _prompts, _run
from tiny_models import build_model

import bi_rl
from bi_rl import backends, concat
from bi_rl.score.scorer import Item, ScoreConfig, score

LAYERS = 2  # build_model's default depth: two sets a layer (q/k/v, gate/up)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("concat-models")
    out = {}
    for i, arch in enumerate(("qwen3", "llama")):
        for dtype in ("float32", "bfloat16"):
            path = build_model(root / f"{arch}-{dtype}", arch=arch, dtype=dtype, key=50 + i)
            out[arch, dtype] = mlx_lm.load(str(path))
    for nbits in (4, 8):
        path = build_model(
            root / f"q{nbits}", arch="qwen3", dtype="bfloat16", key=60, quantize=nbits
        )
        out["qwen3", f"q{nbits}"] = mlx_lm.load(str(path))
    return out


def forward(model, tokens):
    """Logits of a prefill over `tokens` and of one cached decode step after it, strict mode."""
    cache = make_prompt_cache(model)
    with bi_rl.batch_invariant_mode():
        prefill = model(tokens, cache=cache)
        step = model(tokens[:, -1:], cache=cache)
    mx.eval(prefill, step)
    return prefill, step


def _tokens(model, rows: int) -> mx.array:
    rng = np.random.default_rng(rows)
    return mx.array(rng.integers(4, model.args.vocab_size, size=(rows, 7)))


def _members(model):
    layer = model.layers[0]
    return [layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj]


@pytest.mark.parametrize(
    "key",
    [("qwen3", "float32"), ("qwen3", "bfloat16"), ("llama", "float32"), ("llama", "bfloat16"),
     ("qwen3", "q4"), ("qwen3", "q8")],
)  # fmt: skip
def test_concatenated_forward_has_the_bits_of_the_plain_one(models, key):
    model, _ = models[key]
    quantized = type(model.layers[0].self_attn.q_proj) is nn.QuantizedLinear
    assert quantized == key[1].startswith("q"), "guard: the model is what the case says"
    op = "quantized_matmul" if quantized else "linear"
    # prefills of 7, 35 and 84 rows, decode steps of 1, 5 and 12: on Hopper the few-row, the
    # one-warpgroup and the prefill GEMM, each over the concatenated width
    for rows in (1, 5, 12):
        tokens = _tokens(model, rows)
        counted, calls = counting_backend()
        with backends.use(counted):
            plain = forward(model, tokens)
        own = calls[op]
        calls.clear()
        with backends.use(counted), concat.concatenated(model) as sets:
            assert sets == 2 * LAYERS
            assert isinstance(model.layers[1].mlp.up_proj, concat.Part), "guard: parts in place"
            joined = forward(model, tokens)
        for what, got, want in zip(("prefill", "decode step"), joined, plain, strict=True):
            assert_same_bits(got, want, f"{key} {rows} rows, {what}")
        # guard: one product per set and forward (two forwards) in place of the members' own:
        # q/k/v three calls -> one, gate/up two -> one, per layer
        assert calls[op] == own - 2 * LAYERS * 3, (calls[op], own)
        assert type(model.layers[0].self_attn.q_proj) is not concat.Part, "members restored"


def test_a_changed_concatenated_weight_is_caught(models):
    """Negative control: the comparison above can fail. A product whose concatenated weight
    differs from the members' gives other logits."""
    model, _ = models["qwen3", "float32"]
    tokens = _tokens(model, 3)
    plain = forward(model, tokens)
    with concat.concatenated(model):
        product = model.layers[0].self_attn.k_proj._product
        product.arrays = (product.arrays[0] * 1.5,)
        changed = forward(model, tokens)
    assert (bits(changed[0]) != bits(plain[0])).any()


def test_members_come_back_as_slices_with_their_bits_also_when_the_block_raises(models):
    model, _ = models["qwen3", "q4"]
    keys = ("weight", "scales", "biases")
    before = [tuple(m[k] for k in keys) for m in _members(model)]
    parents = model.layers[0].self_attn
    with pytest.raises(RuntimeError, match="inside"), concat.concatenated(model):
        assert isinstance(parents.q_proj, concat.Part)
        raise RuntimeError("inside the block")
    after = _members(model)
    assert all(type(m) is nn.QuantizedLinear for m in after), "the members are back"
    for old, m in zip(before, after, strict=True):
        for a, k in zip(old, keys, strict=True):
            assert m[k] is not a, "a slice of the concatenation in place of the original"
            assert_same_bits(m[k], a, k)
    with concat.concatenated(model, enabled=False) as sets:
        assert sets == 0 and type(parents.q_proj) is nn.QuantizedLinear


def test_a_part_with_replaced_arrays_or_another_activation_computes_its_own(models):
    model, _ = models["qwen3", "float32"]
    attn = model.layers[0].self_attn
    x = mx.array(np.random.default_rng(0).standard_normal((2, 3, model.args.hidden_size)))
    x = x.astype(mx.float32)
    other = x + 1
    with concat.concatenated(model), bi_rl.batch_invariant_mode():
        q = attn.q_proj(x)
        k_other = attn.k_proj(other)  # not the activation q's product was computed for
        k = attn.k_proj(x)
        new_w = attn.v_proj["weight"] * 2
        attn.v_proj["weight"] = new_w
        v = attn.v_proj(x)
        pairs = [(x, attn.q_proj["weight"]), (other, attn.k_proj["weight"])]
        pairs += [(x, attn.k_proj["weight"]), (x, new_w)]
        want = [bi_rl.ops.linear(a, w) for a, w in pairs]
    for got, ref, what in zip(
        (q, k_other, k, v), want, ("q", "k other", "k", "v new"), strict=True
    ):
        assert_same_bits(got, ref, what)


def test_outside_the_mode_parts_compute_stock_products(models):
    model, _ = models["llama", "bfloat16"]
    attn = model.layers[0].self_attn
    x = mx.array(np.random.default_rng(1).standard_normal((1, 4, model.args.hidden_size)))
    x = x.astype(mx.bfloat16)
    with concat.concatenated(model):
        got = attn.k_proj(x)
        whole = attn.k_proj._product.arrays[0]
        start, end = attn.k_proj._product.starts[1:3]
        want = (x @ whole.T)[..., start:end]
    assert_same_bits(got, want, "stock product, k's columns")


def test_engine_and_scorer_give_the_same_samples_and_scores_concatenated(models, monkeypatch):
    """The engine's samples and the scorer's logprob and fingerprint bits, with and without
    BI_RL_CONCAT_PROJECTIONS=1, in the strict mode (the engine's and scorer's default)."""
    model, tok = models["qwen3", "bfloat16"]
    prompts = _prompts(model.args.vocab_size)
    cfg = ScoreConfig(batch_size=2)
    runs = {}
    for on in (False, True):
        if on:
            monkeypatch.setenv(concat.CONCAT_ENV, "1")
        else:
            monkeypatch.delenv(concat.CONCAT_ENV, raising=False)
        assert concat.enabled() == on
        counted, calls = counting_backend()
        with backends.use(counted):
            samples, _ = _run(model, tok, prompts, batch_size=3, prefill_chunk=4)
            if not on:
                items = [Item(s.prompt_tokens, tuple(s.tokens)) for s in samples if s.tokens]
            runs[on] = (samples, score(model, items, cfg), calls["linear"])
    (plain, scored, n_plain), (joined, rescored, n_joined) = runs[False], runs[True]
    _assert_same(plain, joined)
    for a, b in zip(scored, rescored, strict=True):
        assert (a.logprob_bits == b.logprob_bits).all() and a.fingerprints == b.fingerprints
    # guard: the concatenated products ran, three linear calls fewer a layer and forward
    fewer = n_plain - n_joined
    assert fewer > 0 and fewer % (3 * LAYERS) == 0, (n_plain, n_joined)


class _Attention(nn.Module):
    def __init__(self, dims: int):
        super().__init__()
        self.q_proj = nn.Linear(dims, 4 * dims, bias=False)
        self.k_proj = nn.Linear(dims, dims, bias=False)
        self.v_proj = nn.Linear(dims, dims, bias=False)


def test_the_concatenation_costs_no_memory_once_the_originals_are_freed():
    """The members hold row slices of the concatenation, which share its buffer: the active
    memory inside the block is what it was before (the originals freed), and a guard shows
    the sets were rebuilt."""
    import gc

    model = nn.Module()
    model.layers = [_Attention(512) for _ in range(3)]
    mx.eval(model.parameters())
    gc.collect()
    before = mx.get_active_memory()
    with concat.concatenated(model) as sets:
        assert sets == 3 and isinstance(model.layers[2].v_proj, concat.Part)
        gc.collect()
        inside = mx.get_active_memory()
    weights = 3 * 6 * 512 * 512 * 4  # bytes of the projections' float32 weights
    assert inside - before < weights // 100, (before, inside)
