"""The benchmark harness times both sides and reports them; it asserts nothing about speed."""

from __future__ import annotations

import mlx.core as mx

from bi_rl.bench import kernels
from bi_rl.bench.timing import compare
from bi_rl.cli.bench import kernel_table


def test_compare_times_both_sides_with_the_same_inner_count():
    a = mx.random.normal((64, 64))
    ours, stock = compare(lambda: a @ a, lambda: a + a, samples=4, warmup=1, min_sample_s=0.001)
    assert ours.median_s > 0 and stock.median_s > 0
    assert ours.inner == stock.inner >= 1 and ours.samples == stock.samples == 4


def test_kernel_cases_compute_the_same_function_both_ways():
    cases = [*kernels.gemm_cases(True), *kernels.qmm_cases(True), *kernels.attention_cases(True)]
    assert {c.family for c in cases} == {
        "gemm bf16",
        "qmm 4-bit g64",
        "attention decode bf16",
        "attention prefill bf16",
    }
    for case in cases[:3]:
        assert kernels._relerr(case.ours(), kernels._f64(case.stock())) < 1e-2


def test_table_marks_missed_targets_and_refusals():
    rows = [
        {
            "family": "gemm bf16",
            "case": "M=1",
            "target": 1.3,
            "status": "ok",
            "ours_ms": 2.0,
            "stock_ms": 1.0,
            "ratio": 2.0,
            "spread": 0.01,
        },
        {
            "family": "gemm bf16",
            "case": "M=8",
            "target": 1.3,
            "status": "refused",
            "detail": "matmul on the metal backend",
        },
    ]
    text = kernel_table(rows)
    assert "MISS" in text and "REFUSED: matmul on the metal backend" in text
