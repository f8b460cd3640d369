"""The fused keyed draw and fingerprint (bi_rl/backends/cuda/sample_kernel.py,
kernels/cuda/sample.cu) against the MLX ops that define them.

Properties: its tokens equal sample_scaled's (no filters; greedy) and its fingerprints equal
row_fingerprints', bit for bit, on every logits dtype, at temperatures 1, 0.7 and 0, for rows
of 1 to 64, vocabularies on both sides of the kernel's chunk (4095 / 4096 / 4097) and the
1.7B shape's 151936, and on rows built to break a careless maximum: ties, -inf and +inf,
signed zeros, all-equal rows, a NaN anywhere (the row's length, as the MLX ops give); a row
alone gives the bits it gives among other rows; strided logits (a slice of the model's
(B, T, V) output) read in place; the engine's draw runs the kernel on CUDA (guard) and the MLX
ops with BI_RL_FUSED_DRAW=0 or filters on; `sampler.fingerprints`, the scorer's path, gives
row_fingerprints' integers at the scorer's piece sizes, and the scorer runs it. On any
machine: the kernels compile for sm_90 without spills (nvcc), arguments they do not read are
refused before a launch, and the kernel's two lanes are the ones bi_rl.logprobs defines.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from conftest import rand
from test_cuda_attention_build import NVCC, compile_all

from bi_rl.backends.cuda import sample_kernel as K
from bi_rl.logprobs import fingerprint_index_hash, row_fingerprints, scaled_logits
from bi_rl.rollout import sampler as S

on_cuda = pytest.mark.skipif(not mx.cuda.is_available(), reason="needs MLX's CUDA backend")
DTYPES = {"bfloat16": mx.bfloat16, "float16": mx.float16, "float32": mx.float32}


@pytest.mark.skipif(NVCC is None, reason="needs nvcc")
def test_kernels_compile_without_spills(tmp_path):
    cases = [
        (
            f"partial {dt} greedy={g}",
            K.partial_spec(),
            [(dt, 2), (mx.uint32, 2), (mx.uint32, 2), (mx.float32, 1)],
            [mx.uint32],
            [("T", dt), ("GREEDY", g)],
        )
        for dt in DTYPES.values()
        for g in (False, True)
    ]
    cases.append(
        ("combine", K.combine_spec(), [(mx.uint32, 3)], [mx.int32, mx.uint32], [("VOCAB", 151936)])
    )
    for label, built in compile_all(cases, tmp_path):
        assert not built.spills and 0 < built.registers <= 64, f"{label}: {built.log}"


def _draw(logits, keys, temperature, greedy):
    return K.draw(logits, keys, fingerprint_index_hash(logits.shape[-1]), temperature, greedy)


def _keys(rows: int, seed: int = 0) -> mx.array:
    return S.row_keys(seed, [(S.sequence_id(f"p{i}", 0), 7 + i) for i in range(rows)])


def _reference(logits, keys, temperature):
    cfg = S.SamplerConfig(temperature=temperature)
    x = scaled_logits(logits, temperature)
    return S.sample_scaled(x, keys, cfg), row_fingerprints(logits)


def _check(logits, keys, temperature, what):
    want_t, want_f = _reference(logits, keys, temperature)
    got_t, got_f = _draw(logits, keys, temperature, temperature == 0)
    mx.eval(want_t, want_f, got_t, got_f)
    assert got_t.dtype == mx.int32 and got_f.dtype == mx.uint32
    wt, gt = np.array(want_t).astype(np.int64), np.array(got_t).astype(np.int64)
    assert (wt == gt).all(), f"{what}: tokens differ in rows {np.nonzero(wt != gt)[0][:8]}"
    wf, gf = np.array(want_f), np.array(got_f)
    assert (wf == gf).all(), f"{what}: fingerprints differ"
    return gt


@on_cuda
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("temperature", [1.0, 0.7, 0.0])
@pytest.mark.parametrize("vocab", [1, 2, 33, 4095, 4096, 4097, 151936])
def test_tokens_and_fingerprints_equal_the_mlx_ops(dtype, temperature, vocab):
    for rows in (1, 7, 8, 64):
        logits = rand((rows, vocab), DTYPES[dtype], vocab + rows) * 3
        _check(logits, _keys(rows), temperature, f"{dtype} T={temperature} {rows}x{vocab}")


@on_cuda
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("temperature", [1.0, 0.0])
def test_awkward_rows(dtype, temperature):
    dt, vocab = DTYPES[dtype], 9000
    base = np.random.default_rng(1).normal(size=(10, vocab)).astype(np.float32)
    inf = np.inf
    base[0] = 0.0  # all equal: greedy takes index 0
    base[1, :] = -inf  # every token impossible: index 0 (the MLX ops' first maximum)
    base[2, [5, 4100, 8999]] = inf  # several +inf, in different chunks
    base[3, 100] = np.nan  # a NaN: the row's length
    base[4, 8999] = np.nan  # a NaN in the last chunk only
    base[5, :4096] = -inf  # the first chunk impossible
    base[6] = -0.0
    base[6, 1::2] = 0.0  # signed zeros alternating
    base[7, [10, 5000]] = 50.0  # a tie across chunks (greedy: the first)
    base[8, :] = np.where(np.arange(vocab) % 2, -inf, base[8])
    logits = mx.array(base).astype(dt)
    got = _check(logits, _keys(10), temperature, f"{dtype} T={temperature} awkward rows")
    assert got[3] == vocab and got[4] == vocab  # NaN rows give the vocabulary size
    if temperature == 0:
        assert got[0] == 0 and got[1] == 0 and got[2] == 5 and got[7] == 10


@on_cuda
def test_a_row_alone_and_in_a_batch_give_the_same_bits():
    vocab = 151936
    logits = rand((64, vocab), mx.bfloat16, 3) * 4
    keys = _keys(64)
    t_all, f_all = _draw(logits, keys, 1.0, False)
    for r in (0, 7, 8, 63):
        t_one, f_one = _draw(logits[r : r + 1], keys[r : r + 1], 1.0, False)
        assert np.array(t_one)[0] == np.array(t_all)[r]
        assert (np.array(f_one)[0] == np.array(f_all)[r]).all()


@on_cuda
def test_strided_logits_are_read_in_place():
    """The engine passes model(...)[:, -1, :]: a (B, V) view of a (B, T, V) output."""
    vocab = 5000
    full = rand((4, 3, vocab), mx.bfloat16, 9) * 3
    view = full[:, -1, :]
    _check(view, _keys(4), 1.0, "a (B, T, V)[:, -1, :] view")
    _check(full[:, :, 17], _keys(4), 1.0, "a column-strided view")


@on_cuda
def test_the_engine_draw_runs_the_kernel_and_falls_back(monkeypatch):
    """Guard: sampler.draw takes the kernel on CUDA without filters, the MLX ops otherwise;
    every path gives the same bits."""
    logits = rand((8, 6000), mx.bfloat16, 5) * 3
    keys = _keys(8)
    calls = []
    real = K.draw
    monkeypatch.setattr(K, "draw", lambda *a: calls.append(a) or real(*a))
    x = scaled_logits(logits, 1.0)
    cfg = S.SamplerConfig(temperature=1.0)
    fused = S.draw(logits, x, keys, cfg)
    assert len(calls) == 1
    monkeypatch.setenv(S.FUSED_ENV, "0")
    plain = S.draw(logits, x, keys, cfg)
    assert len(calls) == 1
    monkeypatch.delenv(S.FUSED_ENV)
    filtered = S.draw(logits, x, keys, S.SamplerConfig(temperature=1.0, top_k=50))
    assert len(calls) == 1  # filters: the MLX ops
    for a, b in zip(fused, plain, strict=True):
        assert (np.array(a) == np.array(b)).all()
    want = S.sample_scaled(x, keys, S.SamplerConfig(temperature=1.0, top_k=50))
    assert (np.array(filtered[0]) == np.array(want)).all()


def test_the_kernel_reads_the_two_fingerprint_lanes_logprobs_defines():
    """sample.cu sums exactly two lanes (index_hash rows 0 and 1); a third lane in
    bi_rl.logprobs would need the kernel changed with it."""
    from bi_rl.logprobs import FINGERPRINT_LANES

    assert len(FINGERPRINT_LANES) == 2


def test_what_the_kernel_does_not_read_is_refused_before_any_launch():
    from bi_rl.backends.base import Unsupported

    keys = _keys(2)
    for bad in (mx.zeros((2, 3, 5)), mx.zeros((2, 5), mx.int32), mx.zeros((0, 5))):
        with pytest.raises(Unsupported):
            _draw(bad, keys, 1.0, False)
    many = mx.zeros((K.MAX_ROWS + 1, 3))
    with pytest.raises(Unsupported):
        K.draw(many, _keys(1), fingerprint_index_hash(3), 1.0, False)
    with pytest.raises(ValueError, match="keys must be"):
        _draw(mx.zeros((3, 5)), keys, 1.0, False)
    with pytest.raises(ValueError, match="index_hash must be"):
        K.draw(mx.zeros((2, 5)), keys, fingerprint_index_hash(6), 1.0, False)


@on_cuda
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows", [1, 7, 1766, 4097])
def test_fingerprints_alone_equal_row_fingerprints(dtype, rows):
    """sampler.fingerprints, the scorer's path: the kernel's greedy pass with keys it does not
    read, at the row counts of the scorer's pieces (up to 2**28 // 151936 = 1766 at the 1.7B
    vocabulary, more at smaller ones)."""
    vocab = 151936 if rows <= 1766 else 5000
    logits = rand((rows, vocab), DTYPES[dtype], rows) * 3
    got, want = S.fingerprints(logits), row_fingerprints(logits)
    assert (np.array(got) == np.array(want)).all(), f"{dtype} {rows}x{vocab}"


@on_cuda
def test_the_scorer_fingerprints_through_the_kernel(monkeypatch):
    """Guard: a scoring pass on CUDA computes its fingerprints with the kernel, and with
    BI_RL_FUSED_DRAW=0 with the MLX ops, the same integers either way."""
    from bi_rl.score import scorer

    logits = rand((9, 7000), mx.bfloat16, 11) * 3
    calls = []
    real = K.draw
    monkeypatch.setattr(K, "draw", lambda *a: calls.append(a) or real(*a))
    targets = np.arange(9) % 7000
    cfg = scorer.ScoreConfig()
    fused = scorer._row_outputs([logits], targets, None, cfg, None)
    assert len(calls) == 1
    monkeypatch.setenv(S.FUSED_ENV, "0")
    plain = scorer._row_outputs([logits], targets, None, cfg, None)
    assert len(calls) == 1
    assert (np.array(fused[1]) == np.array(plain[1])).all()
    assert (np.array(fused[0]).view(np.uint32) == np.array(plain[0]).view(np.uint32)).all()
