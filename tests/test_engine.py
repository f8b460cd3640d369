"""bi_rl.rollout.engine: continuous batching that never changes a sample.

Properties: every sample's tokens, logprob bits and fingerprints are bitwise identical alone
(batch 1) and batched (7, 8, 13, 64), in any admission order and prefill chunking, with
guards that the schedules really differed (left padding, reused slots, chunk edges, fan-out
of a shared prompt); a logged token's logprob and fingerprint equal a one-shot full forward
over prompt + completion; forwards run inside batch_invariant_mode; stops and limits end
samples as documented.
"""

from dataclasses import replace

import mlx.core as mx
import mlx_lm
import numpy as np
import pytest
from conftest import assert_same_unmasked_samples, record_masks
from tiny_models import build_model

import bi_rl
from bi_rl.logprobs import fingerprint_ints, row_fingerprints, token_logprobs
from bi_rl.rollout import batch as batch_mod
from bi_rl.rollout import engine as engine_mod
from bi_rl.rollout.engine import Engine, EngineConfig, Trace
from bi_rl.rollout.prompts import Prompt
from bi_rl.rollout.sampler import SamplerConfig

LENGTHS = [1, 2, 3, 4, 5, 8, 9, 12, 17, 30]  # around prefill chunks of 3, 4 and 8
STOPS = (9, 20, 33)  # a few common ids, so samples end at scattered steps


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    out = {}
    for name, kw in {
        "qwen2": {},
        "llama": {"arch": "llama", "key": 1},
        "qwen2-bf16": {"dtype": "bfloat16", "key": 2},
    }.items():
        out[name] = mlx_lm.load(str(build_model(root / name, **kw)))
    return out


def _prompts(vocab, lengths=LENGTHS):
    rng = np.random.default_rng(0)
    return [
        Prompt(f"p{i}", tuple(int(t) for t in rng.integers(4, vocab, size=n)))
        for i, n in enumerate(lengths)
    ]


def _run(model, tok, prompts, *, sampler=None, order=None, **cfg):
    cfg = {"n": 2, "max_tokens": 12, "stop_tokens": STOPS, **cfg}
    sampler = replace(sampler or SamplerConfig(), seed=3)
    eng = Engine(model, tok, sampler, EngineConfig(**cfg))
    trace, out = Trace(), []
    for step in eng.generate(prompts, order=order, trace=trace):
        out += step.ready
    return out, trace


def _key(s):
    return (s.unit, s.tokens, s.logprob_bits, s.fingerprints, s.finish, s.stop)


def _assert_same(a, b):
    assert [x.unit for x in a] == [x.unit for x in b], "samples must come out in canonical order"
    for x, y in zip(a, b, strict=True):
        assert _key(x) == _key(y), f"sample {x.unit} differs between schedules"


@pytest.mark.parametrize("name", ["qwen2", "llama", "qwen2-bf16"])
def test_samples_identical_alone_and_batched(models, name):
    model, tok = models[name]
    prompts = _prompts(model.args.vocab_size)
    units = len(prompts) * 2
    alone, tr1 = _run(model, tok, prompts, batch_size=1)
    assert max(len(r) for r in tr1.rows) == 1
    rng = np.random.default_rng(1)
    schedules = [  # pipelined and one step at a time: the same samples either way
        {"batch_size": 7, "prefill_chunk": 4},
        {"batch_size": 8, "prefill_chunk": 8, "order": list(rng.permutation(units))},
        {"batch_size": 13, "prefill_chunk": 512, "order": list(range(units))[::-1]},
        {"batch_size": 64, "prefill_chunk": 3, "order": list(rng.permutation(units))},
    ]
    schedules[1]["pipeline"] = schedules[2]["pipeline"] = False
    if name != "qwen2":  # the other models: the two most different schedules
        schedules = schedules[::3]
    for sched in schedules:
        batched, tr = _run(model, tok, prompts, **sched)
        _assert_same(alone, batched)
        # guards: the schedule really was different from running alone
        assert max(len(r) for r in tr.rows) > 1, "rows shared a batch"
        assert max(max(p) for p in tr.left_padding) > 0, "the cache had left padding"
        if sched["batch_size"] < units:
            assert any(active > 0 for _, _, active in tr.admissions), "a freed slot was reused"
    lengths = {len(s.tokens) for s in alone}
    assert len(lengths) > 2, "samples ended at different steps"
    assert any(s.finish == "stop" for s in alone) and any(s.finish == "length" for s in alone)


def test_cache_growth_past_the_preallocation_step(models):
    """Rows whose caches cross mlx-lm's 256-slot step during prefill and decode."""
    model, tok = models["qwen2"]
    prompts = _prompts(model.args.vocab_size, [250, 3, 259, 40])
    alone, _ = _run(model, tok, prompts, n=1, batch_size=1, stop_tokens=())
    batched, tr = _run(model, tok, prompts, n=1, batch_size=3, prefill_chunk=128, stop_tokens=())
    _assert_same(alone, batched)
    assert max(max(p) for p in tr.left_padding) > 200


def test_comparison_catches_a_batch_keyed_sampler(models, monkeypatch):
    """Negative control: keying noise by batch row instead of sequence changes samples."""
    model, tok = models["qwen2"]
    prompts = _prompts(model.args.vocab_size)[:6]
    real = engine_mod.row_keys
    monkeypatch.setattr(
        engine_mod,
        "row_keys",
        lambda seed, rows: real(seed, [(i, t) for i, (_, t) in enumerate(rows)]),
    )
    alone, _ = _run(model, tok, prompts, batch_size=1)
    batched, _ = _run(model, tok, prompts, batch_size=8)
    assert any(_key(a) != _key(b) for a, b in zip(alone, batched, strict=True))


@pytest.mark.parametrize("name", ["qwen2", "llama", "qwen2-bf16"])
def test_logged_tokens_equal_a_full_forward(models, name):
    """Each logged logprob / fingerprint equals one forward over prompt + completion."""
    model, tok = models[name]
    prompts = _prompts(model.args.vocab_size)
    samples, _ = _run(model, tok, prompts, batch_size=5, prefill_chunk=4)
    cfg = SamplerConfig()
    for s in samples[::3]:
        seq = list(s.prompt_tokens) + s.tokens[:-1]
        with bi_rl.batch_invariant_mode():
            logits = model(mx.array([seq]))[0, len(s.prompt_tokens) - 1 :]
            lp = token_logprobs(logits, mx.array(s.tokens), cfg.temperature)
            fp = row_fingerprints(logits)
        assert np.array(lp).view(np.uint32).tolist() == s.logprob_bits
        assert fingerprint_ints(np.array(fp)) == s.fingerprints


def test_forwards_run_inside_the_mode(models):
    model, tok = models["qwen2"]
    seen = []

    class Spy:
        def __init__(self, m):
            self.m, self.layers = m, m.layers

        def __getattr__(self, name):  # what the engine asks of a model (e.g. named_modules)
            return getattr(self.m, name)

        def __call__(self, *a, **k):
            seen.append((bi_rl._state.in_mode(), bi_rl._state.strict()))
            return self.m(*a, **k)

    prompts = _prompts(model.args.vocab_size)[:3]
    _run(Spy(model), tok, prompts, batch_size=2, max_tokens=3)
    assert seen and all(m and s for m, s in seen)
    seen.clear()
    _run(Spy(model), tok, prompts, batch_size=2, max_tokens=3, mode="fallback")
    assert seen and all(m and not s for m, s in seen)
    seen.clear()
    _run(Spy(model), tok, prompts, batch_size=2, max_tokens=3, mode="off")
    assert seen and not any(m for m, _ in seen)


def test_a_run_installs_the_modes_wrappers_once(models, monkeypatch):
    """The mode is entered once a step; the wrappers stay installed for the whole run
    (mode.held), so a run patches MLX's symbols once, not once a step, and restores them."""
    from bi_rl import _stock, mode

    model, tok = models["qwen2"]
    installs = []
    real = mode._install
    monkeypatch.setattr(mode, "_install", lambda: installs.append(1) or real())
    out, trace = _run(model, tok, _prompts(model.args.vocab_size)[:3], batch_size=2)
    assert len(trace.rows) > 5, "guard: the run took many decode steps"
    assert len(installs) == 1
    assert mx.matmul is _stock.matmul, "the run must leave MLX as it found it"


def test_shared_prompts_fan_out_and_greedy_samples_agree(models):
    model, tok = models["qwen2"]
    prompts = _prompts(model.args.vocab_size)[:4]
    sampled, tr = _run(model, tok, prompts, n=3, batch_size=12)
    groups = [g for _, g, _ in tr.admissions]
    assert any(len({u // 3 for u in g}) < len(g) for g in groups), "a prompt was fanned out"
    by_prompt = [sampled[i : i + 3] for i in range(0, 12, 3)]
    assert any(len({tuple(s.tokens) for s in g}) > 1 for g in by_prompt), "samples differ at T=1"
    greedy, _ = _run(model, tok, prompts, n=3, batch_size=12, sampler=SamplerConfig(0.0))
    for i in range(0, 12, 3):
        assert _key(greedy[i])[1:] == _key(greedy[i + 1])[1:] == _key(greedy[i + 2])[1:]


def test_stops_and_limits(models):
    model, tok = models["qwen2"]
    prompts = _prompts(model.args.vocab_size)[:5]
    free, _ = _run(model, tok, prompts, n=1, max_tokens=10, stop_tokens=())
    assert all(s.finish == "length" and len(s.tokens) == 10 and s.stop is None for s in free)
    # stop on the token each sample drew at step 4: it ends there, the token kept
    for s in free:
        got, _ = _run(
            model, tok, [prompts[s.prompt_index]], n=1, max_tokens=10, stop_tokens=(s.tokens[3],)
        )
        k = s.tokens.index(s.tokens[3])
        assert got[0].tokens == s.tokens[: k + 1] and got[0].finish == "stop"
        assert got[0].stop == s.tokens[3]
    # a stop string: the sample ends at the first token whose text completes it
    s = free[0]
    text = tok.decode(s.tokens)
    target = text[4:6]
    got, _ = _run(
        model, tok, [prompts[0]], n=1, max_tokens=10, stop_tokens=(), stop_strings=(target,)
    )
    g = got[0]
    assert g.finish == "stop" and g.stop == target
    assert target in tok.decode(g.tokens) and target not in tok.decode(g.tokens[:-1])
    assert g.tokens == s.tokens[: len(g.tokens)]


def test_start_continues_the_canonical_sequence(models):
    model, tok = models["qwen2"]
    prompts = _prompts(model.args.vocab_size)[:5]
    full, _ = _run(model, tok, prompts, batch_size=4)
    cfg = EngineConfig(n=2, max_tokens=12, stop_tokens=STOPS, batch_size=3)
    eng = Engine(model, tok, SamplerConfig(seed=3), cfg)
    tail = [s for step in eng.generate(prompts, start=4) for s in step.ready]
    _assert_same(full[4:], tail)
    with pytest.raises(ValueError, match="permutation"):
        next(eng.generate(prompts, start=4, order=[0, 1, 2]))


def test_units_give_the_full_runs_samples_for_any_subset(models):
    """A data-parallel rank runs a subset of the units: each sample must be bitwise the one
    the full run makes, released in ascending unit order, whatever else the subset holds."""
    model, tok = models["qwen2"]
    prompts = _prompts(model.args.vocab_size)[:5]
    full, _ = _run(model, tok, prompts, batch_size=4)
    cfg = EngineConfig(n=2, max_tokens=12, stop_tokens=STOPS, batch_size=3)
    eng = Engine(model, tok, SamplerConfig(seed=3), cfg)
    for units in ([9, 0, 3, 4, 7], [1, 5, 9], [8]):
        trace = Trace()
        got = [s for step in eng.generate(prompts, units=units, trace=trace) for s in step.ready]
        _assert_same([full[u] for u in sorted(units)], got)
        admitted = sorted(u for _, group, _ in trace.admissions for u in group)
        assert admitted == sorted(units), "only the given units ran"
    assert list(eng.generate(prompts, units=[])) == [], "an empty share runs nothing"
    for bad in ([3, 3], [10], [-1]):
        with pytest.raises(ValueError, match="distinct unit numbers"):
            next(eng.generate(prompts, units=bad))
    with pytest.raises(ValueError, match="permutation"):
        next(eng.generate(prompts, units=[1, 2], order=[2, 3]))


def test_bad_inputs(models):
    model, tok = models["qwen2"]
    eng = Engine(model, tok, SamplerConfig(), EngineConfig())
    with pytest.raises(ValueError, match="no tokens"):
        next(eng.generate([Prompt("empty", ())]))
    with pytest.raises(ValueError, match="batch_size"):
        EngineConfig(batch_size=0)
    with pytest.raises(ValueError, match="mode"):
        EngineConfig(mode="loose")

    class Recurrent:
        """A model whose caches the engine cannot batch: state-space and prefix-keeping ones."""

        model_type = "hybrid_ssm"
        layers = [0, 1, 2]

        def make_cache(self):
            from mlx_lm.models.cache import ArraysCache, KVCache, RotatingKVCache

            return [ArraysCache(2), KVCache(), RotatingKVCache(max_size=8, keep=4)]

    version = mlx_lm.__version__
    refused = r"hybrid_ssm \(mlx-lm " + version.replace(".", r"\.") + r"\): .*ArraysCache in "
    with pytest.raises(NotImplementedError, match=refused) as e:
        Engine(Recurrent(), tok, SamplerConfig(), EngineConfig())
    assert "layers 0;" in str(e.value) and "RotatingKVCache(keep=4) in layers 2" in str(e.value)


def test_step_outputs_read_through_their_buffers_as_numpy_reads_them():
    """The engine reads a step's logprob bits and fingerprints through the arrays' buffers;
    they equal the NumPy reading (float32 bits, lane 1 in the high 32 bits), also for
    strided arrays, which take the NumPy path (guard: those really are strided)."""
    rng = np.random.default_rng(3)
    lps = mx.array(rng.normal(size=9).astype(np.float32))
    fps = mx.array(rng.integers(0, 2**32, size=(9, 2), dtype=np.uint64).astype(np.uint32))
    want = (np.array(lps).view(np.uint32).tolist(), fingerprint_ints(np.array(fps)))
    assert engine_mod._read_bits(lps, fps) == want
    assert max(want[1]) >= 2**32, "guard: lane 1 reaches the high bits"
    wide_l = mx.array(rng.normal(size=18).astype(np.float32))
    wide_f = mx.array(rng.integers(0, 2**32, size=(9, 4), dtype=np.uint64).astype(np.uint32))
    strided_l, strided_f = wide_l[::2], wide_f[:, ::2]
    mx.eval(strided_l, strided_f)
    with pytest.raises(TypeError):
        memoryview(strided_f).cast("B")
    want = (np.array(strided_l).view(np.uint32).tolist(), fingerprint_ints(np.array(strided_f)))
    assert engine_mod._read_bits(strided_l, strided_f) == want


def test_host_bookkeeping_matches_the_device(models, monkeypatch):
    """Guard: the padding the engine tracks on the host (so it never reads the device back)
    is the cache's own, at every decode step of a schedule with joins and compactions, and
    so is the flag that lets a cache drop its mask (EngineBatchKVCache.padded): checked on
    padded batches and on batches of several rows with none padded (prompts of one length)."""
    model, tok = models["qwen2"]
    real = Engine._launch
    checked = []

    def launch(self, batch):
        for c in batch.caches:
            assert c.left_padding.tolist() == batch.pad
            assert c._idx == batch.caches[0]._idx
            assert c.padded == (max(batch.pad) > 0), "the host's padded flag is the cache's"
        checked.append((len(batch.rows), max(batch.pad) > 0))
        return real(self, batch)

    monkeypatch.setattr(Engine, "_launch", launch)
    prompts = _prompts(model.args.vocab_size)
    _, tr = _run(model, tok, prompts, batch_size=5, prefill_chunk=4, pipeline=True)
    assert len(checked) > 10 and len({r for r, _ in checked}) > 2, "rows joined and left"
    _run(model, tok, _prompts(model.args.vocab_size, [7, 7, 7]), batch_size=4, prefill_chunk=4)
    assert any(r > 1 and p for r, p in checked) and any(r > 1 and not p for r, p in checked)


@pytest.mark.parametrize("mode", ["off", "strict"])
def test_the_mask_is_dropped_only_where_no_row_is_padded(models, mode, monkeypatch):
    """The engine hands attention no mask when no row is padded (one sequence, or rows
    trimmed to a common start), as mlx-lm's single-sequence cache does; the samples are those
    the always-built mask gives (conftest.assert_same_unmasked_samples: in strict mode the same
    tokens and logprob bits on every device; in mode off the same on the CPU, the same samples
    on CUDA). Guard: unmasked steps happened, and none in padded batches."""
    model, tok = models["qwen2"]
    seen = record_masks(monkeypatch)  # (padded, several queries, "none" / "causal" / "array")
    prompts = _prompts(model.args.vocab_size, [5, 9, 17])
    dropped, _ = _run(model, tok, prompts, batch_size=1, mode=mode)
    assert any(k != "array" for _, _, k in seen), "some steps ran without a mask"
    _run(model, tok, prompts, batch_size=3, mode=mode)  # padded rows keep their masks
    assert any(p for p, _, _ in seen), "padded steps ran"
    assert all(not p for p, _, k in seen if k != "array"), "dropped only where no row is padded"
    seen.clear()
    monkeypatch.setattr(batch_mod, "_mark", lambda caches, pad: None)  # padded stays True
    kept, _ = _run(model, tok, prompts, batch_size=1, mode=mode)
    assert seen and all(k == "array" for _, _, k in seen), "control: every step masked"
    assert_same_unmasked_samples(dropped, kept, mode)


def test_decode_is_pipelined_and_finished_rows_linger(models, monkeypatch):
    """Step t + 1 is queued before step t is read; a row that finished stays in the batch
    (its outputs ignored) until compaction, and the samples are still those of a row alone."""
    model, tok = models["qwen2"]
    events = []
    launch, collect = Engine._launch, Engine._collect
    monkeypatch.setattr(
        Engine, "_launch", lambda self, b: events.append("launch") or launch(self, b)
    )
    monkeypatch.setattr(
        Engine, "_collect", lambda self, s, f: events.append("collect") or collect(self, s, f)
    )
    prompts = _prompts(model.args.vocab_size)[:6]
    batched, tr = _run(model, tok, prompts, n=1, batch_size=8, pipeline=True)
    assert events[:3] == ["launch", "launch", "collect"], "the next step queued first"
    events.clear()
    unpiped, _ = _run(model, tok, prompts, n=1, batch_size=8, pipeline=False)
    assert events[:3] == ["launch", "collect", "launch"], "one step at a time"
    _assert_same(batched, unpiped)
    steps_in_batch = [sum(u in r for r in tr.rows) for u in range(len(batched))]  # n = 1
    # one step past its last token is the pipeline's (queued before the finish was seen)
    assert all(k >= len(s.tokens) + 1 for k, s in zip(steps_in_batch, batched, strict=True))
    lingered = [k > len(s.tokens) + 1 for k, s in zip(steps_in_batch, batched, strict=True)]
    assert any(lingered), "a finished row stayed in the batch until a later compaction"
    monkeypatch.undo()
    alone, _ = _run(model, tok, prompts, n=1, batch_size=1)
    _assert_same(alone, batched)
