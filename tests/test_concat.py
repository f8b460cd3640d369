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
and scores they give without it; on the CUDA backend (stand-in kernels) a set reruns the
launch its op made for an activation of the same shape, and goes through the op again for
another shape or backend.
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


@pytest.mark.parametrize(("arm", "saved"), [("1", 3), ("attention", 2), ("mlp", 1)])
def test_engine_and_scorer_give_the_same_samples_and_scores_concatenated(
    models, monkeypatch, arm, saved
):
    """The engine's samples and the scorer's logprob and fingerprint bits, with and without
    BI_RL_CONCAT_PROJECTIONS (every set, q/k/v alone, gate/up alone), in the strict mode (the
    engine's and scorer's default); guard: `saved` fewer linear calls a layer and forward."""
    from bi_rl.rollout import engine

    # no grouping in the plain run (on Hopper it would group the sets and keep launches past
    # the op, which the counts below could not see); bi_rl.fusion's tests check grouping
    monkeypatch.setattr(engine, "pays_off", lambda: False)
    model, tok = models["qwen3", "bfloat16"]
    prompts = _prompts(model.args.vocab_size)
    cfg = ScoreConfig(batch_size=2)
    runs = {}
    for on in (False, True):
        monkeypatch.setenv(concat.CONCAT_ENV, arm if on else "0")
        assert concat.enabled(invariant=True) == on
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
    # guard: the concatenated products ran, `saved` linear calls fewer a layer and forward
    fewer = n_plain - n_joined
    assert fewer > 0 and fewer % (saved * LAYERS) == 0, (n_plain, n_joined)


def test_the_variable_chooses_the_sets_and_a_bad_value_is_named(monkeypatch):
    monkeypatch.setattr(concat, "faster_here", lambda: False)
    for value, sets in (("", ()), ("0", ()), ("1", concat.SIBLINGS)):
        monkeypatch.setenv(concat.CONCAT_ENV, value)
        for invariant in (False, True):
            assert concat.chosen_sets(invariant) == sets
            assert concat.enabled(invariant) == bool(sets)
    monkeypatch.setenv(concat.CONCAT_ENV, "mlp")
    assert concat.chosen_sets() == (("gate_proj", "up_proj"),)
    monkeypatch.setenv(concat.CONCAT_ENV, "attention")
    assert concat.chosen_sets() == (("q_proj", "k_proj", "v_proj"),)
    monkeypatch.setenv(concat.CONCAT_ENV, "yes")
    with pytest.raises(ValueError, match=r"BI_RL_CONCAT_PROJECTIONS must be one of .*got 'yes'"):
        concat.chosen_sets()


def test_unset_every_set_inside_the_mode_where_it_was_timed_faster(monkeypatch):
    """Unset, where faster_here(): every set for a run inside the mode, and outside it for a
    rollout whose decode steps hold more than one row (rows 2 and past; not 1, nor a run
    that does not decode, rows None); none elsewhere. A value set by the user wins either
    way ("0" none inside the mode or at many rows, "1" every set outside it at one row)."""
    monkeypatch.delenv(concat.CONCAT_ENV, raising=False)
    for here in (False, True):
        monkeypatch.setattr(concat, "faster_here", lambda here=here: here)
        every = concat.SIBLINGS if here else ()
        for rows in (None, 1, 2, 8, 64):
            assert concat.chosen_sets(invariant=True, rows=rows) == every
        assert concat.chosen_sets(invariant=False) == ()
        assert concat.chosen_sets(invariant=False, rows=1) == ()
        assert concat.chosen_sets(invariant=False, rows=2) == every
        assert concat.chosen_sets(invariant=False, rows=64) == every
        monkeypatch.setenv(concat.CONCAT_ENV, "0")
        assert concat.chosen_sets(invariant=True) == ()
        assert concat.chosen_sets(invariant=False, rows=64) == ()
        monkeypatch.setenv(concat.CONCAT_ENV, "1")
        assert concat.chosen_sets(invariant=False) == concat.SIBLINGS
        assert concat.chosen_sets(invariant=False, rows=1) == concat.SIBLINGS
        monkeypatch.setenv(concat.CONCAT_ENV, "mlp")
        assert concat.chosen_sets(invariant=True) == (concat.MLP,)
        monkeypatch.delenv(concat.CONCAT_ENV)


def test_an_off_mode_rollout_concatenates_where_its_steps_hold_several_rows(models, monkeypatch):
    """Unset, where faster_here(): a mode-off rollout builds every set when its decode steps
    can hold more than one row (batch size and units both past 1) and none when they hold one
    (batch size 1, or one unit whatever the batch size); the scorer in mode off builds none.
    Guard: the parts ran (a counted Part call) exactly in the runs that built sets."""
    from bi_rl.rollout import engine
    from bi_rl.score import scorer

    monkeypatch.delenv(concat.CONCAT_ENV, raising=False)
    monkeypatch.setattr(concat, "faster_here", lambda: True)
    built, calls = [], []
    real = concat.concatenated

    def spy(model, enabled=True, sets=concat.SIBLINGS):
        built.append(sets)
        return real(model, enabled, sets=sets)

    part_call = concat.Part.__call__
    monkeypatch.setattr(
        concat.Part, "__call__", lambda self, x: calls.append(1) or part_call(self, x)
    )
    monkeypatch.setattr(engine, "concatenated", spy)
    monkeypatch.setattr(scorer, "concatenated", spy)
    model, tok = models["qwen3", "bfloat16"]
    prompts = _prompts(model.args.vocab_size)
    for batch_size, n, units, want in (
        (1, 2, None, ()),
        (3, 2, None, concat.SIBLINGS),
        (3, 1, [0], ()),
    ):
        calls.clear()
        eng = engine.Engine(
            model,
            tok,
            engine.SamplerConfig(seed=3),
            engine.EngineConfig(n=n, max_tokens=4, batch_size=batch_size, mode="off"),
        )
        samples = []
        for step in eng.generate(prompts, units=units):
            samples += step.ready
        assert samples and built[-1] == want, (batch_size, n, units)
        assert bool(calls) == bool(want), "parts ran exactly where sets were built"
    items = [Item(s.prompt_tokens, tuple(s.tokens)) for s in samples if s.tokens]
    score(model, items, ScoreConfig(batch_size=2, mode="off"))
    assert built[-1] == (), "the scorer concatenates nothing in mode off"


def test_concatenation_is_timed_faster_only_on_hopper():
    """faster_here() is the CUDA backend on a Hopper GPU (bi_rl.backends.cuda.hopper), and
    never on the CPU backend, whatever the machine."""
    with backends.use(backends.get("cpu")):
        assert concat.faster_here() is False
    if mx.cuda.is_available():
        from bi_rl.backends.cuda import hopper

        with backends.use(backends.get("cuda")):
            assert concat.faster_here() is hopper.available()


def test_sets_of_one_kind_leave_the_others_as_they_are(models, monkeypatch):
    """`sets` rebuilds only the kinds it names: with gate/up alone q/k/v stay the model's own
    modules, and the other way round; with none named the model is not walked."""
    model, _ = models["qwen3", "bfloat16"]
    layer = model.model.layers[0]
    with concat.concatenated(model, sets=(concat.MLP,)) as n:
        assert n == LAYERS
        assert isinstance(layer.mlp.gate_proj, concat.Part)
        assert type(layer.self_attn.q_proj) is nn.Linear
    with concat.concatenated(model, sets=(concat.ATTENTION,)) as n:
        assert n == LAYERS
        assert isinstance(layer.self_attn.k_proj, concat.Part)
        assert type(layer.mlp.up_proj) is nn.Linear
    assert type(layer.mlp.gate_proj) is nn.Linear and type(layer.self_attn.q_proj) is nn.Linear

    walked = []
    real = concat.sibling_slots
    monkeypatch.setattr(concat, "sibling_slots", lambda m: walked.append(m) or real(m))
    with concat.concatenated(model, sets=()) as n:  # no kind named: not even a walk
        assert n == 0 and walked == []
        assert type(layer.mlp.gate_proj) is nn.Linear
    with concat.concatenated(model, sets=(concat.MLP,)) as n:  # the guard: a walk
        assert n == LAYERS and walked == [model]


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


@pytest.mark.skipif(
    mx.cuda.is_available(), reason="its stand-ins would replace the kernels this GPU process runs"
)
@pytest.mark.parametrize("quantized", [False, True], ids=["bf16", "4-bit"])
def test_a_set_reruns_the_launch_its_op_made_for_the_same_shape(monkeypatch, quantized):
    """On the CUDA backend (Hopper paths, stand-in kernels that record each launch) a set's
    first product inside the mode goes through its op (ops.linear / ops.quantized_matmul on
    the concatenated arrays), and later ones with an activation of the same shape run the
    launch that call made: the same kernel on the same arguments (guard: the op ran once).
    Another activation shape, another backend object and a backend whose op runs stock MLX go
    through the op again (negative controls); outside the mode no launch runs at all."""
    from test_fusion import (
        _counting_op,
        _other_backends_go_through_the_op,
        _recording_hopper,
        _same_launch,
        _Siblings,
    )

    from bi_rl.backends import cuda

    launches = _recording_hopper(monkeypatch)
    name = "quantized_matmul" if quantized else "linear"
    through_ops = _counting_op(monkeypatch, name)
    attn = _Siblings(quantized)
    mx.eval(attn.parameters())

    def qkv(x):
        return [m(x) for m in (attn.q_proj, attn.k_proj, attn.v_proj)]

    xs = [mx.random.normal((1, 1, 128), key=mx.random.key(k)).astype(mx.bfloat16) for k in range(3)]
    with concat.concatenated(attn) as sets, backends.use(cuda.BACKEND):
        assert sets == 1
        with bi_rl.batch_invariant_mode():
            outs = qkv(xs[0])
            assert len(through_ops) == 1 and len(launches) == 1, "one product, one launch"
            assert [o.shape for o in outs] == [(1, 1, 128), (1, 1, 64), (1, 1, 64)]
            for i, x in enumerate(xs[1:], 2):
                qkv(x)
                assert len(through_ops) == 1, "later products run the kept launch directly"
                assert len(launches) == i and _same_launch(launches[0], launches[-1], x)
            qkv(mx.zeros((1, 2, 128), mx.bfloat16))  # another activation shape: the op again
            assert len(through_ops) == 2 and len(launches) == 4
            _other_backends_go_through_the_op(qkv, xs, name, through_ops, launches)
        before = (len(through_ops), len(launches))
        qkv(xs[0])  # outside the mode: stock MLX's product, no op and no launch
        assert (len(through_ops), len(launches)) == before


def test_every_command_that_runs_a_model_refuses_a_bad_setting_first(tmp_path, monkeypatch, capsys):
    """A value of BI_RL_CONCAT_PROJECTIONS outside concat.CHOICES (and one of BI_RL_ATTN_SPLIT
    outside its sizes, BI_RL_HOPPER_FILL, BI_RL_HOPPER_TMA or BI_RL_HOPPER_PINGPONG other than
    0 or 1, BI_RL_HOPPER_DECODE_COLUMNS other than a block width) stops bi-rollout, bi-rescore,
    bi-audit --model, bi-verify --model, bi-bench and bi-train with one line naming the
    variable, before any output exists (the log, the adapters, the report)."""
    from bi_rl.cli import audit, bench, rescore, rollout, train, verify

    monkeypatch.setenv(concat.CONCAT_ENV, "qkv")
    log = tmp_path / "none.jsonl"
    runs = (
        (rollout.main, ["--out", str(log)], 1),
        (rescore.main, [str(log), "--report", str(tmp_path / "r.json")], 2),
        (audit.main, [str(log), "--model"], 2),
        (verify.main, ["--model", str(tmp_path), "--json", str(tmp_path / "v.json")], 2),
        (bench.main, ["--quick", "--only", "e2e", "--json", str(tmp_path / "b.json")], 2),
        (train.main, ["--adapter-path", str(tmp_path / "adapters")], 2),
    )
    for main, argv, code in runs:
        assert main(argv) == code, main.__module__
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0 and "BI_RL_CONCAT_PROJECTIONS must be one of" in err, err
        assert "got 'qkv'" in err
    monkeypatch.delenv(concat.CONCAT_ENV)
    monkeypatch.setenv("BI_RL_ATTN_SPLIT", "300")  # the attention split size, checked alike
    for main, argv, code in runs:
        assert main(argv) == code, main.__module__
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0 and "BI_RL_ATTN_SPLIT must be one of" in err, err
    monkeypatch.delenv("BI_RL_ATTN_SPLIT")
    for name, bad, said in (
        ("BI_RL_HOPPER_FILL", "yes", "must be 0 or 1"),  # the Hopper GEMM's block shapes
        ("BI_RL_HOPPER_DECODE_COLUMNS", "48", "must be one of"),
        ("BI_RL_HOPPER_PINGPONG", "on", "must be 0 or 1"),  # the prefill attention's schedule
        ("BI_RL_HOPPER_TMA", "true", "must be 0 or 1"),  # the Hopper GEMM's copies past 64 rows
    ):
        monkeypatch.setenv(name, bad)
        for main, argv, code in runs:
            assert main(argv) == code, main.__module__
            err = capsys.readouterr().err.strip()
            assert err.count("\n") == 0 and f"{name} {said}" in err, err
        monkeypatch.delenv(name)
    assert list(tmp_path.iterdir()) == []
