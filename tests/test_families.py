"""Model families end to end on the CPU: rollout (batch 8) vs rescoring (batch 3, shuffled).

For random-weight, CPU-sized models of the families RL users train beyond Qwen2/Llama
(tests/test_engine.py, tests/test_scorer.py): qwen3 and phi3 (dense), qwen3_moe and
mixtral (mixture of experts: gather_mm / gather_qmm), gpt_oss (experts with biases,
attention sinks, sliding-window and full layers alternating), gemma2 (attention written by
hand with soft-capped logits, grouped-query heads) and gemma3_text (sliding-window and
global layers), in float32, bfloat16 and 4-bit: every logged token's float32 logprob and
logit-row fingerprint, from KV-cached batched decode in strict mode, equals a rescoring in
full forward passes batched differently, bit for bit. Prompts cross the sliding window of 8
and decoding wraps it several times.

Guards prove the paths under test ran: the MoE gathers and batched matmuls went through the
mode (a counting backend), the windowed caches' masks served rows past twice the window,
samples joined a running batch, and the rescoring composition differed. On the CPU stock
MLX is itself invariant, so the negative controls live with the pieces: tests/test_caches.py
(mlx-lm's rotating cache, or a mask without the window, differs) and tests/test_composed.py
(a row-count-sensitive or chunk-rounding GEMM is caught).
"""

from __future__ import annotations

import mlx_lm
import numpy as np
import pytest
from conftest import counting_backend
from tiny_models import build_model

from bi_rl import backends
from bi_rl.rollout.caches import WindowedBatchKVCache
from bi_rl.rollout.engine import Engine, EngineConfig, Trace
from bi_rl.rollout.prompts import Prompt
from bi_rl.rollout.sampler import SamplerConfig, sequence_id
from bi_rl.score.scorer import Item, ScoreConfig, ScoreTrace, score, shuffled_order

LENGTHS = (1, 3, 7, 8, 9, 12, 17, 25)  # both sides of the window of 8, and past it
MAX_TOKENS = 24  # decoding wraps the window of 8 several times
SAMPLER = SamplerConfig(temperature=1.0, top_p=0.95, seed=11)

# name -> build_model arguments. Gemma 2 gets grouped-query heads (4 query, 2 kv) and
# smaller weights: it scales embeddings by sqrt(hidden), and at the default scale its
# soft-capped logits saturate, so every sample repeats one token and none stops early.
GEMMA2 = {"heads": 4, "kv_heads": 2, "scale": 0.1}
Q4 = {"dtype": "bfloat16", "quantize": 4, "hidden": 64, "heads": 1}  # narrower: see SLOW
CASES = {
    "qwen3": {},
    "phi3": {},
    "qwen3_moe": {},
    "qwen3_moe-bf16": {"dtype": "bfloat16"},
    "qwen3_moe-q4": Q4,
    "mixtral": {},
    "mixtral-bf16": {"dtype": "bfloat16"},
    "mixtral-q4": Q4,
    "gpt_oss": {},
    "gpt_oss-bf16": {"dtype": "bfloat16"},
    "gpt_oss-q4": Q4,
    "gemma2": GEMMA2,
    "gemma2-q4": {**GEMMA2, "dtype": "bfloat16", "quantize": 4},
    "gemma3_text": {},
    "gemma3_text-q4": Q4,
}
# Slow-marked twins (quantized bf16 GEMMs are slow on the CPU): each repeats a path a fast
# case covers (composed half-precision gathers, gather_qmm, quantized attention projections).
SLOW = ("mixtral-bf16", "gpt_oss-bf16", "mixtral-q4", "gemma2-q4")
MOE = ("qwen3_moe", "mixtral", "gpt_oss")
WINDOW = 8  # tiny_models' sliding window
WINDOWED = ("gpt_oss", "gemma3_text")


@pytest.mark.parametrize(
    "case", [pytest.param(c, marks=pytest.mark.slow) if c in SLOW else c for c in CASES]
)
def test_rollout_and_rescoring_agree_bitwise(case, tmp_path, monkeypatch):
    arch = case.split("-")[0]
    kw = CASES[case]
    model, tok = mlx_lm.load(str(build_model(tmp_path / case, arch, **kw)))
    windowed_masks = []
    make_mask = WindowedBatchKVCache.make_mask

    def spy(self, N, *args, **kwargs):
        windowed_masks.append(int(self.offset.max()) + N)  # the longest row's length
        return make_mask(self, N, *args, **kwargs)

    monkeypatch.setattr(WindowedBatchKVCache, "make_mask", spy)
    rng = np.random.default_rng(0)
    vocab = model.args.vocab_size
    prompts = [
        Prompt(f"p{i}", tuple(int(t) for t in rng.integers(4, vocab, n)))
        for i, n in enumerate(LENGTHS)
    ]
    cfg = EngineConfig(n=2, max_tokens=MAX_TOKENS, stop_tokens=(9, 20, 33), batch_size=8)
    spy_backend, calls = counting_backend()
    trace = Trace()
    with backends.use(spy_backend):
        samples = [
            s
            for step in Engine(model, tok, SAMPLER, cfg).generate(prompts, trace=trace)
            for s in step.ready
        ]
    items = [
        Item(s.prompt_tokens, tuple(s.tokens), sequence_id(s.prompt_id, s.sample)) for s in samples
    ]
    strace = ScoreTrace()
    order = shuffled_order(len(items), 1)
    rescored = score(model, items, ScoreConfig(batch_size=3), order=order, trace=strace)
    differing = [
        (s.unit, j)
        for s, r in zip(samples, rescored, strict=True)
        for j, (a, b) in enumerate(zip(s.logprob_bits, r.logprob_bits.tolist(), strict=True))
        if a != b
    ]
    tokens = sum(len(s.tokens) for s in samples)
    assert not differing, f"{case}: {len(differing)} of {tokens} logprobs differ: {differing[:5]}"
    assert [s.fingerprints for s in samples] == [r.fingerprints for r in rescored]
    if arch in WINDOWED:  # rescoring through caches, 5 positions at a time, agrees too
        chunked = score(model, items, ScoreConfig(batch_size=5, chunk=5), order=order[::-1])
        assert [r.logprob_bits.tolist() for r in chunked] == [s.logprob_bits for s in samples]
    # Guards: the composition differed, samples joined a running batch, the paths ran.
    assert max(len(b) for b in strace.batches) == 3 and order != sorted(order)
    assert any(already for _, _, already in trace.admissions[1:]), "no sample joined mid-run"
    assert tokens > 8 * len(LENGTHS), "samples must decode past the window"
    if arch in MOE:
        gather = "gather_qmm" if "quantize" in kw else "gather_mm"
        assert calls[gather] > 0, f"{case}: the experts did not go through the mode"
    if arch == "gemma2":
        assert calls["batched_matmul"] > 0, "the hand-written attention did not go through the mode"
    if arch in WINDOWED:
        assert max(windowed_masks) > 2 * WINDOW, f"{case}: decoding never wrapped the window"
    else:
        assert not windowed_masks
