"""bi_rl.score.scorer: rescoring reproduces every logged bit, whatever the composition.

Properties: the float32 logprob bits and logit-row fingerprints the rollout engine logged
(KV-cached batched decode) equal the scorer's (full forward passes) for batch sizes 1, 3, 7,
8 and 13, canonical, reversed and shuffled orders, right padding, and chunking through a KV
cache with chunk edges just before, at and just after the first completion position; guards
prove the composition differed (batch sizes, padding, chunk counts). Re-derived tokens equal
the logged ones with the run's seed and not with another (a negative control). A one-ulp
change of one weight changes bits (the comparison can fail). Logprobs agree with a float64
reference within 1e-5. Bad inputs raise one-line ValueErrors.
"""

from dataclasses import replace

import mlx.core as mx
import mlx_lm
import numpy as np
import pytest
from tiny_models import build_model

from bi_rl import batch_invariant_mode
from bi_rl.rollout.engine import Engine, EngineConfig
from bi_rl.rollout.prompts import Prompt
from bi_rl.rollout.sampler import SamplerConfig, sequence_id
from bi_rl.score.scorer import Item, ScoreConfig, ScoreTrace, score, shuffled_order

# Prompt lengths put the first completion position (length - 1) on both sides of chunk
# edges at 3, 4, 5, 8 and 9, and make some sequences span several chunks.
LENGTHS = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 17, 30]
STOPS = (9, 20, 33)
SAMPLER = SamplerConfig(temperature=1.0, seed=3)


@pytest.fixture(scope="module")
def rollouts(tmp_path_factory):
    root = tmp_path_factory.mktemp("scorer")
    out = {}
    for name, kw in {
        "qwen2": {},
        "llama-bf16": {"arch": "llama", "dtype": "bfloat16", "key": 5},
    }.items():
        model, tok = mlx_lm.load(str(build_model(root / name, **kw)))
        rng = np.random.default_rng(0)
        prompts = [
            Prompt(f"p{i}", tuple(int(t) for t in rng.integers(4, model.args.vocab_size, n)))
            for i, n in enumerate(LENGTHS)
        ]
        cfg = EngineConfig(n=2, max_tokens=10, stop_tokens=STOPS, batch_size=8)
        samples = [
            s for step in Engine(model, tok, SAMPLER, cfg).generate(prompts) for s in step.ready
        ]
        items = [
            Item(s.prompt_tokens, tuple(s.tokens), sequence_id(s.prompt_id, s.sample))
            for s in samples
        ]
        out[name] = (model, samples, items)
    return out


def _qwen3(**shape):
    """A one-layer random-weight Qwen3 (mlx-lm's own class) of the given widths."""
    from mlx_lm.models import qwen3

    base = {"model_type": "qwen3", "num_hidden_layers": 1, "rms_norm_eps": 1e-6,
            "rope_theta": 1e4}  # fmt: skip
    return qwen3.Model(qwen3.ModelArgs.from_dict({**base, **shape}))


def _random_items(seed: int, vocab: int, n: int, prompt: int, completion: int, low: int):
    """n Items of random token ids in [low, vocab): `prompt` prompt and `completion`
    completion tokens each."""
    rng = np.random.default_rng(seed)

    def ids(k):
        return tuple(int(t) for t in rng.integers(low, vocab, k))

    return [Item(ids(prompt), ids(completion)) for _ in range(n)]


def _recorded_pieces(monkeypatch) -> list[list[int]]:
    """The rows of each piece every scoring pass hands `_row_outputs`, one list a pass, as
    the scorer calls it from now on in the test."""
    import bi_rl.score.scorer as S

    passes = []
    real = S._row_outputs

    def recording(pieces, *args):
        passes.append([p.shape[0] for p in pieces])
        return real(pieces, *args)

    monkeypatch.setattr(S, "_row_outputs", recording)
    return passes


def _assert_bitwise(samples, scored, what):
    for s, r in zip(samples, scored, strict=True):
        logged = np.array(s.logprob_bits, dtype=np.uint32)
        assert r.logprob_bits.dtype == np.uint32
        assert np.array_equal(r.logprob_bits, logged), f"{what}: logprob bits of {s.unit} differ"
        assert r.fingerprints == s.fingerprints, f"{what}: logit rows of {s.unit} differ"


@pytest.mark.parametrize("name", ["qwen2", "llama-bf16"])
@pytest.mark.parametrize(
    "batch_size,order",
    [(1, "canonical"), (3, "shuffled"), (7, "reversed"), (8, "shuffled"), (13, "canonical")],
)
def test_rescoring_equals_rollout_across_batches_and_orders(rollouts, name, batch_size, order):
    model, samples, items = rollouts[name]
    n = len(items)
    perm = {
        "canonical": list(range(n)),
        "reversed": list(range(n))[::-1],
        "shuffled": shuffled_order(n, batch_size),
    }[order]
    trace = ScoreTrace()
    scored = score(model, items, ScoreConfig(batch_size=batch_size), order=perm, trace=trace)
    _assert_bitwise(samples, scored, f"batch {batch_size}, {order}")
    # Guards: the batches really had this size and order, and rows really were padded.
    assert [i for b in trace.batches for i in b] == perm
    assert max(len(b) for b in trace.batches) == min(batch_size, n)
    if batch_size > 1:
        assert any(p > 0 for pads in trace.padding for p in pads), "no row was padded"


@pytest.mark.parametrize("name", ["qwen2", "llama-bf16"])
@pytest.mark.parametrize("chunk", [1, 3, 4, 5, 8, 9])
def test_rescoring_equals_rollout_with_chunking(rollouts, name, chunk):
    model, samples, items = rollouts[name]
    trace = ScoreTrace()
    scored = score(
        model,
        items,
        ScoreConfig(batch_size=5, chunk=chunk),
        order=shuffled_order(len(items), chunk),
        trace=trace,
    )
    _assert_bitwise(samples, scored, f"chunk {chunk}")
    assert max(len(c) for c in trace.chunk_starts) > 2, "sequences must span several chunks"
    # The first completion position (prompt length - 1) falls just before, on and just after
    # a chunk edge for some sample: the edge cases where a cache could misalign a row.
    firsts = {len(it.prompt) - 1 for it in items}
    edges = {k * chunk for k in range(1, 40 // chunk + 1)}
    if chunk > 1:
        assert (
            {e - 1 for e in edges} & firsts and edges & firsts and {e + 1 for e in edges} & firsts
        )


def test_rederived_tokens_equal_logged_and_not_with_another_seed(rollouts):
    model, samples, items = rollouts["qwen2"]
    got = score(model, items, ScoreConfig(batch_size=6), derive=SAMPLER)
    assert [r.tokens for r in got] == [s.tokens for s in samples], "tokens must re-derive"
    other = score(
        model, items, ScoreConfig(batch_size=6), derive=replace(SAMPLER, seed=SAMPLER.seed + 1)
    )
    assert [r.tokens for r in other] != [s.tokens for s in samples], "another seed must differ"


def test_rederived_tokens_follow_the_samplers_temperature_not_the_scorers(rollouts):
    """Logprobs at one temperature, tokens re-derived at the sampler's own: the sampler
    scales the logits itself where the two differ (and shares them where they agree)."""
    model, samples, items = rollouts["qwen2"]
    got = score(model, items, ScoreConfig(batch_size=6, temperature=0.7), derive=SAMPLER)
    assert [r.tokens for r in got] == [s.tokens for s in samples], "tokens must re-derive"
    logged = [s.logprob_bits for s in samples]
    assert [list(r.logprob_bits) for r in got] != [list(b) for b in logged], (
        "guard: the logprobs were taken at another temperature"
    )


def test_a_one_ulp_weight_change_is_seen(rollouts, tmp_path):
    """Negative control: the comparison is sharp enough to fail."""
    _, samples, items = rollouts["qwen2"]
    model, _ = mlx_lm.load(str(build_model(tmp_path / "m")))  # same weights as "qwen2"
    w = model.model.layers[0].mlp.down_proj.weight
    bits = np.array(w).view(np.uint32).copy()
    # every weight of one output row, one ulp up: a single weight's ulp can round away in
    # every logit (it did on the CUDA backend, whose f32 GEMM sums in another order)
    bits[0, :] += 1
    model.model.layers[0].mlp.down_proj.weight = mx.array(bits.view(np.float32))
    scored = score(model, items, ScoreConfig(batch_size=4))
    differ = sum(
        int((r.logprob_bits != np.array(s.logprob_bits, np.uint32)).sum())
        for s, r in zip(samples, scored, strict=True)
    )
    assert differ > 0, "a changed weight must change some logprob bits"


def test_logprobs_match_a_float64_reference(rollouts):
    model, samples, items = rollouts["qwen2"]
    scored = score(model, items[:4], ScoreConfig(batch_size=4))
    for it, r in zip(items[:4], scored, strict=True):
        seq = list(it.prompt) + list(it.completion[:-1])
        # the logits of the path the scorer takes (in the mode: on CUDA, stock float32 GEMMs
        # use TF32, 1e-2 off in logprob here); the log-softmax is then taken in float64
        with batch_invariant_mode():
            logits = np.array(model(mx.array([seq]))[0], dtype=np.float64)
        rows = logits[len(it.prompt) - 1 :]
        m = rows.max(axis=-1, keepdims=True)
        lse = (m + np.log(np.exp(rows - m).sum(axis=-1, keepdims=True)))[:, 0]
        ref = rows[np.arange(len(it.completion)), list(it.completion)] - lse
        np.testing.assert_allclose(r.logprobs, ref, rtol=0, atol=1e-5)


def test_temperature_is_applied(rollouts):
    model, _, items = rollouts["qwen2"]
    a = score(model, items[:2], ScoreConfig(temperature=1.0))
    b = score(model, items[:2], ScoreConfig(temperature=0.7))
    g = score(model, items[:2], ScoreConfig(temperature=0.0))  # greedy: logprobs at T = 1
    assert not np.array_equal(a[0].logprob_bits, b[0].logprob_bits)
    assert np.array_equal(a[0].logprob_bits, g[0].logprob_bits)


def test_bad_input_is_named(rollouts):
    model, _, items = rollouts["qwen2"]
    with pytest.raises(ValueError, match="empty prompt"):
        score(model, [Item((), (5, 6))])
    with pytest.raises(ValueError, match=r"sample 1: token id 999 is outside"):
        score(model, [items[0], Item((5,), (6, 999))], ScoreConfig(batch_size=2))
    with pytest.raises(ValueError, match="permutation"):
        score(model, items[:3], order=[0, 0, 1])
    with pytest.raises(ValueError, match="seq_id"):
        score(model, [Item((5,), (6,))], derive=replace(SAMPLER, seed=0))
    with pytest.raises(ValueError, match="chunk"):
        ScoreConfig(chunk=0)


def test_models_with_caches_the_engine_cannot_batch_score_whole_sequences(rollouts):
    """Whole-sequence scoring needs no cache; chunked scoring refuses in one line."""
    model, samples, items = rollouts["qwen2"]

    class StateSpaceCaches:  # the same network, declaring caches bi-rl cannot batch
        model_type = "hybrid"
        layers = model.layers

        def __call__(self, tokens, cache=None):
            return model(tokens, cache=cache)

        def make_cache(self):
            from mlx_lm.models.cache import ArraysCache

            return [ArraysCache(2) for _ in model.layers]

    whole = score(StateSpaceCaches(), items[:4], ScoreConfig(batch_size=3))
    assert [r.logprob_bits.tolist() for r in whole] == [s.logprob_bits for s in samples[:4]]
    with pytest.raises(NotImplementedError, match=r"hybrid \(mlx-lm .*\): chunked scoring"):
        score(StateSpaceCaches(), items[:4], ScoreConfig(batch_size=3, chunk=2))


# Every family the scorer runs the output head on the read rows alone (ROW_HEAD_FAMILIES)
# that tiny_models builds, with gemma2's soft cap; quantized once (the head a quantized GEMM).
HEAD_CASES = {
    "qwen2": {},
    "llama": {"dtype": "bfloat16"},
    "qwen3": {},
    "phi3": {},
    "qwen3_moe": {},
    "mixtral": {},
    "gpt_oss": {},
    "gemma2": {"heads": 4, "kv_heads": 2, "scale": 0.1},
    "gemma3_text": {},
    "qwen3-q4": {"arch": "qwen3", "dtype": "bfloat16", "quantize": 4, "hidden": 64, "heads": 1},
}


@pytest.mark.parametrize("case", list(HEAD_CASES))
@pytest.mark.parametrize("chunk", [None, 4])
def test_the_head_runs_on_the_read_rows_alone_with_every_bit_of_all_rows(
    case, chunk, tmp_path, monkeypatch
):
    """Rows read from a head run on them alone equal those read from every position's
    logits (logprob bits, fingerprints, re-derived tokens); the trace shows the head ran on
    fewer rows than the positions, and on all of them with the family taken off the list
    (the control)."""
    import bi_rl.score.scorer as S

    kw = dict(HEAD_CASES[case])
    arch = kw.pop("arch", case)
    model, _ = mlx_lm.load(str(build_model(tmp_path / case, arch, **kw)))
    rng = np.random.default_rng(1)
    vocab = model.args.vocab_size
    items = [
        Item(
            tuple(int(t) for t in rng.integers(4, vocab, n)),
            tuple(int(t) for t in rng.integers(4, vocab, c)),
            sequence_id(f"p{i}", 0),
        )
        for i, (n, c) in enumerate([(3, 5), (11, 2), (6, 9), (1, 4)])
    ]
    cfg = ScoreConfig(batch_size=3, chunk=chunk)

    def run():
        trace = ScoreTrace()
        out = score(model, items, cfg, derive=SAMPLER, trace=trace)
        return out, trace.head_rows

    rows_only, head = run()
    assert sum(r for r, _ in head) == sum(len(it.completion) for it in items)
    assert sum(r for r, _ in head) < sum(p for _, p in head)
    monkeypatch.setattr(S, "ROW_HEAD_FAMILIES", frozenset())
    every_row, control = run()
    assert all(ran == positions for ran, positions in control)
    for a, b in zip(rows_only, every_row, strict=True):
        assert np.array_equal(a.logprob_bits, b.logprob_bits), case
        assert a.fingerprints == b.fingerprints, case
        assert a.tokens == b.tokens, case


def test_a_head_that_reshapes_its_rows_is_refused(rollouts, monkeypatch):
    """A listed family whose output is not one row per row given stops with a message
    naming the list, instead of reading wrong rows."""
    model, _, items = rollouts["qwen2"]
    cls = type(model)
    monkeypatch.setattr(cls, "__call__", lambda self, x, cache=None: self.model(x, cache)[:, :1])
    with pytest.raises(RuntimeError, match="ROW_HEAD_FAMILIES"):
        score(model, items[:3], ScoreConfig(batch_size=3))


def test_a_listed_family_that_is_not_a_module_is_scored_from_every_row(rollouts):
    """A wrapper object that names a listed family but is no nn.Module (no body to stand in
    for) is called as it is: every position's logits, the same bits."""
    model, samples, items = rollouts["qwen2"]

    class Wrapper:
        args = model.args
        layers = model.layers

        def __call__(self, tokens, cache=None):
            return model(tokens, cache=cache)

    trace = ScoreTrace()
    scored = score(Wrapper(), items[:4], ScoreConfig(batch_size=4), trace=trace)
    assert [r.logprob_bits.tolist() for r in scored] == [s.logprob_bits for s in samples[:4]]
    assert all(ran == positions for ran, positions in trace.head_rows)


@pytest.mark.parametrize("name", ["qwen2", "llama-bf16"])
@pytest.mark.parametrize("row_head", [True, False])
@pytest.mark.parametrize("chunk", [None, 5])
def test_the_head_run_on_pieces_of_rows_gives_every_logged_bit(
    rollouts, name, row_head, chunk, monkeypatch
):
    """With the head's output bounded to a few rows' elements (as it is to 2**31 elements for
    stock MLX's 32-bit indexing), each forward pass's rows go through the head and the
    logprob / fingerprint / sampling steps in pieces: every logged bit and token is still
    reproduced, for a head on the read rows alone and on every position. Guard: passes
    really were split, into pieces of at most the bound."""
    import bi_rl.score.scorer as S

    model, samples, items = rollouts[name]
    vocab = model.args.vocab_size
    if not row_head:
        monkeypatch.setattr(S, "ROW_HEAD_FAMILIES", frozenset())
    monkeypatch.setattr(S, "HEAD_ELEMENTS", 3 * vocab + vocab // 2)
    sizes = _recorded_pieces(monkeypatch)
    cfg = ScoreConfig(batch_size=7, chunk=chunk)
    scored = score(model, items, cfg, derive=SAMPLER)
    _assert_bitwise(samples, scored, f"{name} pieces")
    assert [r.tokens for r in scored] == [list(s.tokens) for s in samples]
    assert any(len(s) > 1 for s in sizes), "no pass was split"
    assert all(max(s) <= 3 for s in sizes)


def test_pieces_are_evaluated_one_at_a_time_and_bound_the_memory(monkeypatch):
    """Scoring 800 completion rows against a 32768-token vocabulary: with SCORE_ELEMENTS at 2**22
    logits (7 pieces) the pass holds one piece's logits and temporaries at a time, under half
    the peak memory of the one-piece pass (the control), with the same bits in strict mode.
    Guard: the bounded pass ran in several pieces, the control in one."""
    import mlx.nn as nn

    import bi_rl.score.scorer as S

    # head dim 64: the smallest the CUDA attention kernels take in strict mode
    model = _qwen3(
        hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
        head_dim=64, vocab_size=32768, tie_word_embeddings=False, max_position_embeddings=1024,
    )  # fmt: skip
    model.update(nn.utils.tree_map(lambda p: p * 0.5, model.parameters()))
    mx.eval(model.parameters())
    items = _random_items(2, 32768, 4, 20, 200, low=1)
    pieces = _recorded_pieces(monkeypatch)

    def peak(elements):
        monkeypatch.setattr(S, "SCORE_ELEMENTS", elements)
        mx.clear_cache()
        mx.reset_peak_memory()
        base = mx.get_active_memory()
        out = score(model, items, ScoreConfig(batch_size=4, mode="strict"))
        return mx.get_peak_memory() - base, out

    whole, one = peak(2**31)
    bounded, several = peak(2**22)
    assert [len(p) for p in pieces] == [1, 7], pieces
    assert bounded < 0.5 * whole, (bounded, whole)
    for a, b in zip(one, several, strict=True):
        assert np.array_equal(a.logprob_bits, b.logprob_bits)
        assert a.fingerprints == b.fingerprints


def test_batches_are_pipelined_and_each_waits_for_the_one_before(monkeypatch):
    """Batch i + 1's graph is built before batch i's results are read, and batch i + 1 is
    first evaluated only after batch i is computed (one batch holds the device at a time),
    with every output the bits of scoring the batches one after another (the control: one
    batch at a time, by calling score once a batch). Guard: the events came in that order
    for every batch, chunked (a cache, evaluated chunk by chunk) and whole."""
    import bi_rl.score.scorer as S

    model = _qwen3(
        hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
        head_dim=64, vocab_size=512, tie_word_embeddings=False, max_position_embeddings=1024,
    )  # fmt: skip
    mx.eval(model.parameters())
    items = _random_items(5, 512, 7, 9, 12, low=1)
    events = []
    real_batch, real_wait, real_results = S._score_batch, S._Pending.wait, S._Pending.results
    real_eval, real_async = mx.eval, mx.async_eval

    def batch(*args):
        events.append("build")
        return real_batch(*args)

    def wait(self):
        events.append("wait")
        return real_wait(self)

    def results(self):
        events.append("read")
        return real_results(self)

    monkeypatch.setattr(S, "_score_batch", batch)
    monkeypatch.setattr(S._Pending, "wait", wait)
    monkeypatch.setattr(S._Pending, "results", results)
    monkeypatch.setattr(S.mx, "eval", lambda *a: events.append("eval") or real_eval(*a))
    monkeypatch.setattr(S.mx, "async_eval", lambda *a: events.append("queue") or real_async(*a))
    for chunk in (None, 8):
        cfg = ScoreConfig(batch_size=3, mode="strict", chunk=chunk)
        events.clear()
        got = score(model, items, cfg)
        kinds = list(events)
        builds = [i for i, k in enumerate(kinds) if k == "build"]
        reads = [i for i, k in enumerate(kinds) if k == "read"]
        assert len(builds) == len(reads) == 3, kinds
        for i in range(2):  # batch i + 1 built before batch i is read
            assert builds[i + 1] < reads[i], (chunk, kinds)
        for i in range(1, 3):  # batch i's first evaluation after its wait for batch i - 1
            first = next(j for j in range(builds[i], len(kinds)) if kinds[j] in ("eval", "queue"))
            assert "wait" in kinds[builds[i] : first], (chunk, kinds)
        for k in range(0, len(items), 3):
            want = score(model, items[k : k + 3], cfg)
            for a, b in zip(got[k : k + 3], want, strict=True):
                assert np.array_equal(a.logprob_bits, b.logprob_bits)
                assert a.fingerprints == b.fingerprints


@pytest.mark.parametrize("rows,width,most,expect", [
    (4, 10, 40, [4]), (4, 10, 39, [3, 1]), (7, 10, 20, [2, 2, 2, 1]), (3, 10, 5, [1, 1, 1]),
])  # fmt: skip
def test_head_pieces_split_at_the_element_bound(rows, width, most, expect):
    """One piece up to the bound, pieces of as many rows as fit past it (at least one)."""
    from bi_rl.score.scorer import _split

    whole = mx.arange(rows * width).reshape(rows, width)
    pieces = _split(whole, most, lambda p: whole[p])
    assert [p.shape[0] for p in pieces] == expect
    assert np.array_equal(np.concatenate([np.array(p) for p in pieces]), np.array(whole))


@pytest.mark.parametrize("name", ["qwen2", "llama-bf16"])
def test_a_family_scored_from_every_row_runs_groups_of_batch_rows_within_the_bound(
    rollouts, name, monkeypatch
):
    """A family whose head runs on every position, scored without a cache, with the bound at
    120 positions' logits: the model runs on groups of batch rows whose logits fit (a guard
    sees calls on fewer rows than the batch), and every logged bit and token is reproduced."""
    import bi_rl.score.scorer as S

    model, samples, items = rollouts[name]
    monkeypatch.setattr(S, "ROW_HEAD_FAMILIES", frozenset())
    monkeypatch.setattr(S, "HEAD_ELEMENTS", 120 * model.args.vocab_size)
    shapes = []
    cls = type(model)
    real = cls.__call__

    def recording(self, x, *args, **kwargs):
        shapes.append(tuple(x.shape))
        return real(self, x, *args, **kwargs)

    monkeypatch.setattr(cls, "__call__", recording)
    scored = score(model, items, ScoreConfig(batch_size=7), derive=SAMPLER)
    _assert_bitwise(samples, scored, f"{name} batch groups")
    assert [r.tokens for r in scored] == [list(s.tokens) for s in samples]
    whole = [s for s in shapes if s[0] == 7]
    groups = [s for s in shapes if s[0] < 7 and s[0] * s[1] <= 120]
    assert whole and groups, shapes  # split batches, each group within the bound


@pytest.mark.skipif(not mx.cuda.is_available(), reason="needs MLX's CUDA backend")
def test_a_head_past_2_31_logits_is_scored_in_both_modes_on_cuda(monkeypatch):
    """64 samples of 256 completion tokens against a 151936-token 4-bit head: 16384 rows,
    more than 2**31 logits, which stock MLX's CUDA quantized matmul cannot index in one call
    (it fails to launch). Both modes score them (the head runs in pieces: a guard sees
    them), and in strict mode each sample's bits are those of scoring 16 at a time (4096 rows,
    fewer pieces). The body has real widths (K = 2048): stock MLX 0.32.4's CUDA quantized
    matmul fails to compile its kernel for K = 64 on a pip-installed CUDA (its header
    crt/mma.h is not shipped), which is not what this test is about."""
    import mlx.nn as nn

    import bi_rl.score.scorer as S

    model = _qwen3(
        hidden_size=2048, intermediate_size=2048, num_attention_heads=16, num_key_value_heads=8,
        head_dim=128, vocab_size=151936, tie_word_embeddings=True, max_position_embeddings=4096,
    )  # fmt: skip
    model.set_dtype(mx.bfloat16)
    nn.quantize(model, group_size=64, bits=4)
    mx.eval(model.parameters())
    items = _random_items(4, 151936, 64, 4, 256, low=3)
    recorded = _recorded_pieces(monkeypatch)
    off = score(model, items, ScoreConfig(batch_size=64, mode="off"))
    assert all(np.isfinite(r.logprobs).all() for r in off)
    strict = score(model, items, ScoreConfig(batch_size=64, mode="strict"))
    per = min(S.HEAD_ELEMENTS, S.SCORE_ELEMENTS) // 151936  # rows a piece holds
    pieces = [len(p) for p in recorded]
    assert pieces == [-(-16384 // per)] * 2, pieces
    small = score(model, items, ScoreConfig(batch_size=16, mode="strict"))
    pieces = [len(p) for p in recorded]
    assert pieces[2:] == [-(-4096 // per)] * 4
    for a, b in zip(strict, small, strict=True):
        assert np.array_equal(a.logprob_bits, b.logprob_bits)
        assert a.fingerprints == b.fingerprints
