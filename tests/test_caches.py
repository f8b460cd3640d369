"""bi_rl.rollout.caches: per-layer batch caches that decode with a full forward pass's bits.

Properties: the layer plan reads full and sliding-window layers (and Gemma 2's grouped-query
mask need) from mlx-lm's own caches; a left-padded batch decoded through the windowed cache,
across several wraps of the window, gives every logits row the bits of a one-shot full
forward pass. Negative controls: mlx-lm's BatchRotatingKVCache, decoding the same batch,
differs from the full forward pass once the window wraps (float32); so does a cache whose
mask drops the window (the window really matters to these sequences); Gemma 2 with
grouped-query heads fails at batch 3 with mlx-lm's plain BatchKVCache and, at batch 2
(= its kv head count), silently masks the wrong rows.
"""

from __future__ import annotations

import contextlib

import mlx.core as mx
import mlx_lm
import numpy as np
import pytest
from conftest import (
    assert_same_unmasked_samples,
    attention_reference,
    bits,
    record_masks,
    relerr,
)
from mlx_lm.models.cache import BatchKVCache, BatchRotatingKVCache
from tiny_models import build_model

from bi_rl import _mask_window as mask_window
from bi_rl import batch_invariant_mode, ops
from bi_rl.rollout import batch as batch_mod
from bi_rl.rollout import caches as caches_mod
from bi_rl.rollout.caches import (
    EngineBatchKVCache,
    GroupedMaskBatchKVCache,
    WindowedBatchKVCache,
    batch_caches,
    layer_plan,
    scoring_caches,
)
from bi_rl.rollout.engine import Engine, EngineConfig
from bi_rl.rollout.prompts import Prompt
from bi_rl.rollout.sampler import SamplerConfig
from bi_rl.verify.core import rand

WINDOW = 8  # tiny_models' sliding window


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("caches")
    specs = {
        "gemma3_text": {},
        "gpt_oss": {},
        "gemma2": {"heads": 4, "kv_heads": 2},
        "gemma2-mha": {"arch": "gemma2", "heads": 2, "kv_heads": 2},
        "qwen3_moe": {},
    }
    out = {}
    for name, kw in specs.items():
        kw = {"arch": name, **kw}
        out[name] = mlx_lm.load(str(build_model(root / name, **kw)))[0]
    return out


def test_layer_plan_reads_each_layers_kind(tiny):
    assert layer_plan(tiny["gemma3_text"]).windows == (WINDOW, None)
    assert layer_plan(tiny["gpt_oss"]).windows == (WINDOW, None)
    assert layer_plan(tiny["qwen3_moe"]).windows == (None, None)
    assert layer_plan(tiny["gemma2"]).grouped_mask, "grouped-query Gemma 2 needs the fix"
    assert not layer_plan(tiny["gemma2-mha"]).grouped_mask, "one query per kv head: no fix"
    kinds = [type(c) for c in batch_caches(layer_plan(tiny["gpt_oss"]), [0, 2])]
    assert kinds == [WindowedBatchKVCache, EngineBatchKVCache]
    assert [type(c).__name__ for c in scoring_caches(layer_plan(tiny["gpt_oss"]))] == [
        "WindowedKVCache",
        "KVCache",
    ]


LENGTHS = (3, 11, 6)  # the longest prompt crosses the window before decoding starts
STEPS = 30  # decoding wraps the window of 8 several times


def tokens_for(model):
    rng = np.random.default_rng(7)
    total = max(LENGTHS) + STEPS
    return [rng.integers(4, model.args.vocab_size, total).tolist() for _ in LENGTHS]


def full_forward_rows(model, seqs):
    """Per sequence: logits rows of one forward pass over its whole token list."""
    return [bits(model(mx.array([s]))[0]) for s in seqs]


def decode_rows(model, seqs, caches):
    """Right-padded prefill of the prompts, then STEPS decode steps of the whole batch (the
    engine's flow); per sequence, the logits rows that predict positions len-1 onwards."""
    longest = max(LENGTHS)
    pads = [longest - n for n in LENGTHS]
    for c in caches:
        c.prepare(lengths=list(LENGTHS), right_padding=pads)
    prompt = mx.array([s[:n] + [0] * (longest - n) for s, n in zip(seqs, LENGTHS, strict=True)])
    last = model(prompt, cache=caches)
    for c in caches:
        c.finalize()
    rows = [[bits(last[i, n - 1])] for i, n in enumerate(LENGTHS)]
    for step in range(STEPS):
        y = mx.array([[s[n + step]] for s, n in zip(seqs, LENGTHS, strict=True)])
        out = model(y, cache=caches)
        for i in range(len(seqs)):
            rows[i].append(bits(out[i, 0]))
    return [np.stack(r) for r in rows]


def differing_rows(model, caches) -> int:
    seqs = tokens_for(model)
    with batch_invariant_mode():
        full = full_forward_rows(model, seqs)
        dec = decode_rows(model, seqs, caches)
    return sum(
        int((d != f[n - 1 : n + STEPS]).any(axis=-1).sum())
        for d, f, n in zip(dec, full, LENGTHS, strict=True)
    )


class NoWindow(BatchKVCache):
    """A batch cache whose mask ignores the sliding window: full causal attention."""

    def make_mask(self, N: int, return_array: bool = False, window_size=None, **kwargs):
        return super().make_mask(N, **kwargs)


@pytest.mark.parametrize("family", ["gemma3_text", "gpt_oss"])
def test_windowed_decode_gives_full_forward_bits_across_wraps(tiny, family):
    model = tiny[family]
    caches = batch_caches(layer_plan(model), [0] * len(LENGTHS))
    assert isinstance(caches[0], WindowedBatchKVCache)
    assert differing_rows(model, caches) == 0
    assert int(caches[0].offset.max()) >= 3 * WINDOW, "decoding must wrap the window"


@pytest.mark.parametrize("family", ["gemma3_text", "gpt_oss"])
@pytest.mark.parametrize("cache", ["mlx-lm rotating", "no window"])
def test_rotated_or_unwindowed_caches_differ_from_the_full_forward_pass(tiny, family, cache):
    """Negative controls: rotated keys are reduced in another order (float32 shows it), and
    dropping the window changes what the sequences attend to."""
    model = tiny[family]
    plan = layer_plan(model)
    pads = [0] * len(LENGTHS)
    other = BatchRotatingKVCache if cache == "mlx-lm rotating" else lambda w, p: NoWindow(p)
    caches = [BatchKVCache(pads) if w is None else other(w, pads) for w in plan.windows]
    assert differing_rows(model, caches) > 0


@pytest.mark.parametrize("family", ["gemma3_text", "gpt_oss"])
def test_windowed_layers_hand_attention_their_window_with_the_mask(tiny, family, monkeypatch):
    """Every mask a windowed cache builds reaches attention noted with the layer's window
    (bi_rl._mask_window; the CUDA kernels then read no key before it), in batched decoding
    (the prefill and every step) and in scoring; the full layers' array masks carry none."""
    seen = []
    real = ops.scaled_dot_product_attention

    def spy(q, k, v, scale, mask=None, sinks=None, **kw):
        if isinstance(mask, mx.array):
            seen.append(mask_window.window_of(mask, q.shape[2], k.shape[2]))
        return real(q, k, v, scale, mask, sinks, **kw)

    monkeypatch.setattr(ops, "scaled_dot_product_attention", spy)
    model = tiny[family]
    plan = layer_plan(model)
    seqs = tokens_for(model)
    with batch_invariant_mode():
        decode_rows(model, seqs, batch_caches(plan, [0] * len(LENGTHS)))
        model(mx.array(seqs), cache=scoring_caches(plan))
    assert seen.count(WINDOW) == STEPS + 2, "the prefill, every decode step and the scoring"
    assert set(seen) == {WINDOW, None}, "the full layer's padded-batch masks: no window"


def test_gemma2_grouped_query_batches_need_the_mask_fix(tiny):
    model = tiny["gemma2"]
    plain = [BatchKVCache([0, 0, 0]) for _ in model.layers]
    with pytest.raises(ValueError, match="broadcast"):
        mx.eval(model(mx.array([[5, 6, 7, 8]] * 3), cache=plain))
    # At batch 2 = its kv head count mlx-lm's mask broadcasts, onto the wrong rows.
    seqs = tokens_for(model)[:2]
    lengths = (3, 11)
    with batch_invariant_mode():
        full = full_forward_rows(model, seqs)

    def run(caches):
        longest = max(lengths)
        prompt = [s[:n] for s, n in zip(seqs, lengths, strict=True)]
        padded = mx.array([[0] * (longest - len(p)) + p for p in prompt])
        for c in caches:
            c.prepare(left_padding=[longest - n for n in lengths])
        with batch_invariant_mode():
            out = model(padded, cache=caches)
        return [bits(out[i, -1]) for i in range(2)]

    fixed = run(batch_caches(layer_plan(model), [0, 0]))
    assert isinstance(batch_caches(layer_plan(model), [0])[0], GroupedMaskBatchKVCache)
    assert all(np.array_equal(fixed[i], full[i][n - 1]) for i, n in enumerate(lengths))
    wrong = run([BatchKVCache([0, 0]) for _ in model.layers])
    assert not np.array_equal(wrong[0], full[0][lengths[0] - 1]), "mlx-lm's mask hits row 0"


def test_engine_cache_drops_a_mask_only_unpadded_and_unwindowed():
    """No row padded, no window asked: what mlx-lm's one-sequence KVCache gives (None for one
    query, "causal" for several unless an array is asked for), in the mode and outside it;
    every other case gets mlx-lm's boolean mask, as an unmarked cache (padded by default)
    does."""
    c = EngineBatchKVCache([0, 0])
    assert c.padded, "a cache nobody marked builds its masks"
    assert isinstance(c.make_mask(1), mx.array)
    c.padded = False
    for inside in (False, True):
        with batch_invariant_mode() if inside else contextlib.nullcontext():
            assert c.make_mask(1) is None and c.make_mask(3) == "causal"
            assert isinstance(c.make_mask(3, return_array=True), mx.array)
            assert isinstance(c.make_mask(1, window_size=4), mx.array)
    want = BatchKVCache([0, 0]).make_mask(3, window_size=2)
    assert np.array(c.make_mask(3, window_size=2)).tolist() == np.array(want).tolist()


@pytest.mark.parametrize("dtype", [mx.float32, mx.bfloat16])
def test_stock_attention_without_the_mask_is_the_same_function(dtype):
    """Accuracy: where no row is padded, stock attention given the engine cache's dropped mask
    (None for a decode step, "causal" for a prefill chunk past the first) and given mlx-lm's
    boolean mask both match the float64 reference over the same keys. The two need not agree
    bit for bit: on CUDA the unmasked decode step runs stock's one-query kernel, the masked one
    its unfused path. Tolerance: float32 1e-3 (allowing reduced-precision products in stock's
    unfused path), bfloat16 1e-2; a mask hiding one key (negative control) errs far above it."""
    tol = {mx.float32: 1e-3, mx.bfloat16: 1e-2}[dtype]
    b, hq, hk, d, scale = 2, 4, 2, 64, 64**-0.5
    dropped, masked = EngineBatchKVCache([0, 0]), EngineBatchKVCache([0, 0])
    dropped.padded = False
    for n, key in ((20, 1), (9, 2), (1, 3)):  # a first chunk, a chunk past it, a decode step
        q, k, v = (rand((b, h, n, d), dtype, key * 10 + i) for i, h in enumerate((hq, hk, hk)))
        want_mask = masked.make_mask(n)
        ks, vs = masked.update_and_fetch(k, v)
        got_mask = dropped.make_mask(n)
        dropped.update_and_fetch(k, v)
        assert got_mask == (None if n == 1 else "causal") and isinstance(want_mask, mx.array)
        ref = attention_reference(q, ks, vs, scale, want_mask)
        for mask in (got_mask, want_mask):
            out = mx.fast.scaled_dot_product_attention(q, ks, vs, scale=scale, mask=mask)
            assert relerr(out, ref) < tol, f"{n} queries, mask {type(mask).__name__}"
        hidden = want_mask & (mx.arange(ks.shape[2]) != 3)
        wrong = mx.fast.scaled_dot_product_attention(q, ks, vs, scale=scale, mask=hidden)
        assert relerr(wrong, ref) > 10 * tol, "control: one key hidden changes the function"


@pytest.mark.parametrize("mode", ["off", "strict"])
@pytest.mark.parametrize("family", ["gemma3_text", "gpt_oss", "gemma2", "qwen3_moe"])
def test_unmasked_rollouts_run_every_attention_kind(tiny, family, mode, monkeypatch):
    """One row (never padded): prefill chunks get "causal" (at offsets past the first chunk
    too; an array where the model asks for one) and decode steps no mask on full layers,
    window layers keep theirs; the samples are those of the always-masked control
    (conftest.assert_same_unmasked_samples: in strict mode the same tokens and logprob bits on
    every device; in mode off the same on the CPU, the same samples on CUDA). Covers window
    layers mixed with full ones, sinks and Gemma 2's hand-written attention."""
    model = tiny[family]
    rng = np.random.default_rng(0)
    vocab = model.args.vocab_size
    prompts = [Prompt(f"p{n}", tuple(int(t) for t in rng.integers(4, vocab, n))) for n in (5, 30)]
    seen = record_masks(monkeypatch)

    def run():
        cfg = EngineConfig(n=2, max_tokens=12, batch_size=1, prefill_chunk=8, mode=mode)
        eng = Engine(model, None, SamplerConfig(seed=3), cfg)
        return [s for step in eng.generate(prompts) for s in step.ready]

    dropped = run()
    kinds = {(several, kind) for _, several, kind in seen}
    assert (False, "none") in kinds, "decode steps ran without a mask"
    # prefill: "causal", or an array where the model asks for one (Gemma 2 does)
    assert (True, "causal") in kinds or (family == "gemma2" and (True, "array") in kinds)
    monkeypatch.setattr(batch_mod, "_mark", lambda caches, pad: None)  # every step masked
    seen.clear()
    kept = run()
    kinds = {(several, kind) for _, several, kind in seen}
    assert kinds <= {(True, "array"), (False, "array")}, "control: masks built"
    assert_same_unmasked_samples(dropped, kept, mode)


def test_refusal_names_family_version_and_caches():
    class Quantized:
        model_type = "llama"
        layers = [0]

        def make_cache(self):
            from mlx_lm.models.cache import QuantizedKVCache

            return [QuantizedKVCache()]

    with pytest.raises(NotImplementedError) as e:
        layer_plan(Quantized(), "the scorer")
    msg = str(e.value)
    assert msg.startswith(f"llama (mlx-lm {caches_mod.mlx_lm_version()}): the scorer")
    assert "QuantizedKVCache in layers 0" in msg and "\n" not in msg
