"""The benchmark harness times both sides and reports them; it asserts nothing about speed."""

from __future__ import annotations

import math

import mlx.core as mx
import numpy as np
import pytest
from conftest import f64, relerr

from bi_rl.bench import kernels
from bi_rl.bench.timing import build_s, compare, compare_many
from bi_rl.cli.bench import chain_table, kernel_table
from bi_rl.verify.core import bits


def test_compare_times_both_sides_with_the_same_inner_count():
    a = mx.random.normal((64, 64))
    ours, stock = compare(lambda: a @ a, lambda: a + a, samples=4, warmup=1, min_sample_s=0.001)
    assert ours.median_s > 0 and stock.median_s > 0
    assert ours.inner == stock.inner >= 1 and ours.samples == stock.samples == 4


def test_compare_many_rotates_the_order_and_shares_one_inner_count():
    """Every side gets one sample a round with the same inner count, and the side that starts
    a round moves on by one each round, so drift during a round does not favour one side."""
    a = mx.random.normal((64, 64))
    calls = []

    def side(name, fn):
        def run():
            if not calls or calls[-1] != name:
                calls.append(name)
            return fn()

        return run

    sides = {
        n: side(n, f) for n, f in (("x", lambda: a @ a), ("y", lambda: a + a), ("z", lambda: a * a))
    }
    got = compare_many(sides, samples=6, warmup=1, min_sample_s=0.001)
    assert set(got) == {"x", "y", "z"}
    assert len({t.inner for t in got.values()}) == 1 and all(t.samples == 6 for t in got.values())
    rounds = calls[-18:]  # the timed samples: six rounds of three sides
    firsts = [rounds[3 * r] for r in range(6)]
    assert firsts == ["x", "y", "z", "x", "y", "z"], rounds
    assert all(sorted(rounds[3 * r : 3 * r + 3]) == ["x", "y", "z"] for r in range(6))


def test_kernel_cases_compute_the_same_function_both_ways():
    cases = [*kernels.gemm_cases(True), *kernels.qmm_cases(True), *kernels.attention_cases(True)]
    assert {c.family for c in cases} == {
        "gemm bf16",
        "qmm 4-bit g64",
        "attention decode bf16",
        "attention prefill bf16",
        "attention prefill bf16 left-padded",
        "attention decode bf16 left-padded",
        "attention decode bf16 window 128",
        "attention prefill bf16 window 128",
        "attention decode bf16 window 128 as a mask",
        "attention prefill bf16 window 128 as a mask",
    }
    windowed = [c for c in cases if "window" in c.family]
    padded = [c for c in cases if "left-padded" in c.family]
    # the kernel's window against stock's window mask; both sides under the same bool mask
    for case in cases[:3] + windowed + padded:
        assert relerr(case.ours(), f64(case.stock())) < 1e-2


def test_only_runs_the_one_family_asked_for(monkeypatch):
    """bi-bench --only gemm / qmm / attention: the rows of that family's cases and no other
    (timing stubbed out: this checks which cases run, not how fast)."""

    class Timed:
        median_s, spread, inner = 1e-3, 0.0, 1

    monkeypatch.setattr(kernels, "compare", lambda *a, **k: (Timed, Timed))
    monkeypatch.setattr(kernels, "compare_many", lambda sides, **k: dict.fromkeys(sides, Timed))
    want = {
        "gemm": {"gemm bf16"},
        "qmm": {"qmm 4-bit g64"},
        "attention": {c.family for c in kernels.attention_cases(True)},
    }
    for only, families in want.items():
        rows = kernels.run(True, only=only)
        assert {r["family"] for r in rows} == families, only
        assert all(r["status"] == "ok" for r in rows)
        assert all(r["ours_build_us"] > 0 and r["stock_build_us"] > 0 for r in rows)
        # the products (every quick case is decode-sized) are timed as chains too, attention not
        assert all(("chain_ratio" in r) == (only != "attention") for r in rows), only


def test_build_time_counts_the_graph_and_not_its_evaluation():
    """build_s times building alone: a call whose graph is one node builds in far less time
    than evaluating it takes (a 512 x 512 matmul on the CPU)."""
    a = mx.random.normal((512, 512))
    mx.eval(a)
    built = build_s(lambda: a @ a, inner=4, samples=5)
    ran, _ = compare(lambda: a @ a, lambda: a + a, samples=4, warmup=1, min_sample_s=0.001)
    assert 0 < built < ran.median_s / 5


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
            "ours_build_us": 7.9,
            "stock_build_us": 0.9,
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
    assert "    7.9    0.9" in text  # the host's graph building, ours and stock


def test_e2e_row_measures_all_three_rollouts_and_the_bare_step(tmp_path):
    """One end-to-end row on a tiny Qwen3: the engine in both modes and mlx-lm's
    batch_generate timed on the same prompts, the bare step and rescoring beside them."""
    from dataclasses import replace

    from bi_rl.bench import e2e
    from bi_rl.model import load_model

    w = replace(e2e.WORKLOADS["tiny"], prompt_lens=(4, 9), new_tokens=5)
    paths = e2e.write_models(w, tmp_path / "models")
    assert (paths["bf16"] / "config.json").is_file() and (paths["4-bit"] / "config.json").is_file()
    model, _ = load_model(paths["bf16"])
    row = e2e.run_batch(w, "bf16", model, 2, 1, tmp_path)
    for side in ("strict", "off", "mlx_lm"):  # differences of two timings: any sign on a
        assert math.isfinite(row[f"decode_tok_s_{side}"])  # busy CPU with one repeat
        assert math.isclose(row[f"step_ms_{side}"], 2e3 / row[f"decode_tok_s_{side}"])
        # each run's median decode-only step (5 new tokens: at least two such intervals)
        assert row[f"median_step_ms_{side}"] > 0
        assert math.isclose(row[f"median_step_tok_s_{side}"], 2e3 / row[f"median_step_ms_{side}"])
    for m in ("strict", "off"):
        assert row[f"bare_step_ms_{m}"] > 0 and row[f"rescore_tok_s_{m}"] > 0
        assert row[f"bare_step_first_ms_{m}"] > 0
        assert row[f"engine_vs_bare_{m}"] == row[f"step_ms_{m}"] / row[f"bare_step_ms_{m}"]
        assert 0 <= row[f"bare_wait_share_{m}"] <= 1
        assert 0 < row[f"bare_build_ms_{m}"] < row[f"bare_step_ms_{m}"]
    from bi_rl.cli.bench import e2e_step_table, e2e_table

    header, line = e2e_table({"rows": [row]}).splitlines()
    assert "wait strict" in header and len(line.split()) == 14  # one value a column
    assert row["off_vs_mlx_lm"] == row["decode_tok_s_off"] / row["decode_tok_s_mlx_lm"]
    steps_header, steps_line = e2e_step_table({"rows": [row]}).splitlines()
    assert "median step ms" in steps_header and len(steps_line.split()) == 13
    assert "bare build ms" in steps_header and "concat ms" in steps_header
    assert row["concat_ms_strict"] >= 0 and row["concat_ms_off"] >= 0
    ratio = row["median_step_ms_mlx_lm"] / row["median_step_ms_off"]
    assert math.isclose(row["median_step_off_vs_mlx_lm"], ratio)
    # the progress line carries the row's ratios, for a log whose run a time limit cut short
    said = e2e.row_summary(row)
    rescore = row["rescore_tok_s_strict"] / row["rescore_tok_s_off"]
    assert said.startswith("tiny bf16 B=2: off ") and f"rescore {rescore:.2f}" in said
    assert f"strict {row['engine_vs_bare_strict']:.2f}" in said
    prompts = e2e.make_prompts(5, (4, 9), 100, seed=1)
    assert prompts == e2e.make_prompts(5, (4, 9), 100, seed=1), "keyed, no global state"
    assert {len(p.tokens) for p in prompts} <= set(range(4, 10))


def test_timed_runs_find_their_concatenated_sets_built(monkeypatch, tmp_path):
    """bi-rollout and bi-rescore concatenate sibling projections once a run; the bench builds
    them before each timed rollout and rescoring (`sets_built`), so the engine's and the
    scorer's own blocks inside find them built: each timed call builds every set once, and
    the seconds that took are recorded, not timed. Control: with concatenation off nothing is
    built."""
    from dataclasses import replace

    from bi_rl import concat
    from bi_rl.bench import e2e
    from bi_rl.model import load_model
    from bi_rl.score.scorer import Item, ScoreConfig, score

    w = replace(e2e.WORKLOADS["tiny"], prompt_lens=(4, 9), new_tokens=3)
    model, _ = load_model(e2e.write_models(w, tmp_path / "models")["bf16"])
    sets = 2 * w.shape["num_hidden_layers"]  # q/k/v and gate/up of every layer
    prompts = e2e.make_prompts(2, w.prompt_lens, w.shape["vocab_size"], seed=2)
    builds = []
    real = concat._Product.__init__

    def counted(self, members):
        builds.append(len(members))
        real(self, members)

    monkeypatch.setattr(concat._Product, "__init__", counted)
    for setting, want in (("1", sets), ("0", 0)):
        monkeypatch.setenv(concat.CONCAT_ENV, setting)
        builds.clear()
        spent = []
        _, samples, _ = e2e.rollout(model, prompts, "strict", 3, None, spent)
        assert len(builds) == want and len(spent) == 1 and spent[0] >= 0, (setting, builds)
        builds.clear()
        items = [Item(p.tokens, tuple(s.tokens)) for p, s in zip(prompts, samples, strict=True)]
        with e2e.sets_built(model, "strict", spent):
            score(model, items, ScoreConfig(batch_size=2, mode="strict"))
        assert len(builds) == want and len(spent) == 2, (setting, builds)


def test_models_runs_the_named_models_alone(monkeypatch, tmp_path):
    """`models` picks the workload's models by label (bf16, 4-bit), each loaded in MODELS'
    order; none named: every one; an unknown label is refused before any model is written."""
    from bi_rl.bench import e2e

    written = []

    def write(w, root, say=None):
        written.append(root)
        return {label: tmp_path / label for label, _ in e2e.MODELS}

    monkeypatch.setattr(e2e, "write_models", write)
    monkeypatch.setattr(e2e, "load_model", lambda path: (path.name, None))
    w = e2e.WORKLOADS["tiny"]

    def labels(models):
        return [m for _, m, _ in e2e.each_model(w, str(tmp_path), str(tmp_path), None, models)]

    assert labels(()) == ["bf16", "4-bit"]
    assert labels(("4-bit",)) == ["4-bit"]
    assert labels(("4-bit", "bf16")) == ["bf16", "4-bit"]
    written.clear()
    with pytest.raises(ValueError, match="unknown model '3-bit'"):
        labels(("3-bit",))
    assert not written


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--only", "e2e", "--models", "3-bit"], "unknown model '3-bit'"),
        (["--only", "e2e", "--models", ","], "name at least one of bf16, 4-bit"),
        (["--only", "qmm", "--models", "4-bit"], "--models applies to the end-to-end parts"),
        (["--only", "e2e", "--batches", "8,0"], "batch sizes are positive integers"),
        (["--only", "e2e", "--batches", "eight"], "batch sizes are positive integers"),
    ],
)
def test_bad_end_to_end_options_are_one_line_errors(args, says, capsys):
    from bi_rl.cli.bench import main

    with pytest.raises(SystemExit) as stop:
        main(args)
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert says in err[-1] and err[-1].startswith("bi-bench: error:")


def test_an_unwritable_json_path_stops_the_bench_before_it_times(tmp_path, monkeypatch, capsys):
    from bi_rl.cli import bench

    def must_not_run(*a, **k):
        raise AssertionError("timed before the output was checked")

    monkeypatch.setattr(bench.kernels, "run", must_not_run)
    blocker = tmp_path / "file"
    blocker.write_text("x")
    for path, says in ((tmp_path, "is a directory"), (blocker / "b.json", "is a file")):
        with pytest.raises(SystemExit) as stop:
            bench.main(["--quick", "--only", "gemm", "--json", str(path)])
        assert stop.value.code == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert err[-1].startswith("bi-bench: error:") and "--json" in err[-1], err
        assert says in err[-1], err


def test_the_json_keeps_every_finished_row_when_a_run_is_stopped(tmp_path, monkeypatch):
    """--json is rewritten after each row with "complete": false, so a run stopped by a time
    limit (here an interrupt in the third case) leaves the rows it finished; a run that ends
    writes "complete": true and every row."""
    import orjson

    from bi_rl.cli import bench

    class Timed:
        median_s, spread, inner = 1e-3, 0.0, 1

    calls = []

    def compare(ours, *a, **k):
        if not isinstance(ours, kernels.Chain):  # a case's own timing, not its chains'
            calls.append(1)
        if len(calls) == stop_at:
            raise KeyboardInterrupt
        return Timed, Timed

    monkeypatch.setattr(kernels, "compare", compare)
    monkeypatch.setattr(kernels, "compare_many", lambda sides, **k: dict.fromkeys(sides, Timed))
    out = tmp_path / "b.json"
    cases = len(list(kernels.gemm_cases(True)))
    assert cases >= 3, "the stop must come after some rows and before the last"
    stop_at = 3
    with pytest.raises(KeyboardInterrupt):
        bench.main(["--quick", "--only", "gemm", "--json", str(out)])
    report = orjson.loads(out.read_bytes())
    assert report["complete"] is False and len(report["kernels"]) == 2
    assert report["meta"]["command"].startswith("bi-bench --quick --only gemm")
    assert not list(tmp_path.glob(".*")), "no temporary file left beside the report"
    calls.clear()
    stop_at = 0
    assert bench.main(["--quick", "--only", "gemm", "--json", str(out)]) == 0
    report = orjson.loads(out.read_bytes())
    assert report["complete"] is True and len(report["kernels"]) == cases


def test_long_rescore_times_each_variant_with_its_own_op_set(tmp_path):
    """Long-context rescoring: off, strict and the two halves of strict (only GEMMs or only
    attention invariant) each timed; the halves really run with the other family stock."""
    import warnings
    from dataclasses import replace

    from bi_rl import backends, batch_invariant_mode, ops
    from bi_rl.bench import e2e
    from bi_rl.model import load_model
    from bi_rl.ops import STOCK_OP

    w = replace(e2e.WORKLOADS["tiny"], prompt_lens=(4, 9), new_tokens=5)
    model, _ = load_model(e2e.write_models(w, tmp_path / "models")["bf16"])
    row = e2e.long_rescore(model, batch=2, length=24, completion=8, repeats=1)
    for name in e2e.LONG_VARIANTS:
        assert row[f"seconds_{name}"] > 0 and row[f"tok_s_{name}"] == 48 / row[f"seconds_{name}"]
    assert row["strict_extra_s"] == row["seconds_strict"] - row["seconds_off"]
    full = dict(backends.active().ops)

    def invariant() -> set:
        return {k for k, v in backends.active().ops.items() if v is not STOCK_OP}

    with e2e._only_invariant(e2e.GEMM_OPS):
        assert "scaled_dot_product_attention" not in invariant() and "linear" in invariant()
    with e2e._only_invariant(e2e.ATTENTION_OPS):
        assert invariant() == {"scaled_dot_product_attention"}
        # a stock op runs stock MLX in strict mode: no refusal, no warning
        x, w = mx.ones((2, 8)), mx.ones((3, 8))
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            with batch_invariant_mode():
                assert ops.linear(x, w).tolist() == [[8.0] * 3] * 2
    assert backends.active().ops == full


@pytest.mark.slow
def test_startup_times_each_command_in_a_fresh_process(tmp_path):
    from dataclasses import replace

    from bi_rl.bench import e2e

    w = replace(e2e.WORKLOADS["tiny"], prompt_lens=(4, 9), new_tokens=5)
    paths = e2e.write_models(w, tmp_path / "models")
    s = e2e.startup(paths["bf16"], paths["prompts"], 1, tmp_path)
    assert s["bi_rollout_s"] > 0 and s["bi_rescore_s"] > 0 and s["mlx_lm_load_s"] > 0
    assert s["bi_rollout_over_load_s"] == s["bi_rollout_s"] - s["mlx_lm_load_s"]
    assert (tmp_path / "startup.jsonl").read_bytes().count(b"\n") == 2, "one prompt, one record"


def test_large_inputs_are_drawn_a_row_at_a_time(monkeypatch):
    """Past kernels.LARGE elements the bench draws rows one at a time (MLX's random generator
    refuses 2^32 elements); below it, one draw."""
    monkeypatch.setattr(kernels, "LARGE", 64)
    small = kernels.rand_rows((2, 4, 8), mx.float32, 3)
    assert small.shape == (2, 4, 8)
    big = kernels.rand_rows((3, 4, 8), mx.float32, 3)  # 96 elements > 64
    assert big.shape == (3, 4, 8)
    for i in range(3):
        want = kernels.rand((1, 4, 8), mx.float32, 3000 + i)
        assert (np.array(big[i : i + 1]) == np.array(want)).all()


def test_a_chain_feeds_each_call_the_last_output_without_changing_a_value():
    """Each call's input is x linked to the previous output: the same bits as x (so the same
    product), yet computed from that output, as a NaN planted in it shows (0 * NaN is NaN).
    The link alone (op None) chains x onto itself."""
    x = mx.random.normal((8, 32)).astype(mx.bfloat16)
    w = mx.random.normal((48, 32)).astype(mx.bfloat16)
    seen = []
    chain = kernels.Chain(lambda v: seen.append(v) or v @ w.T, x)
    first, second = chain(), chain()
    assert seen[0] is x and seen[1] is not x and chain.prev is second
    want = bits(x @ w.T)
    for out in (first, second):
        assert np.array_equal(bits(out), want)
    chain.prev = mx.full(second.shape, float("nan"), mx.bfloat16)
    assert np.isnan(np.array(chain().astype(mx.float32))).all()  # guard: the link read it
    link = kernels.Chain(None, x)
    link(), link()
    assert np.array_equal(bits(link.prev), bits(x))


def test_chain_table_gives_the_ratio_with_and_without_the_link():
    rows = [
        {"family": "gemm bf16", "case": "M=1", "status": "ok", "chain_ours_ms": 0.012,
         "chain_stock_ms": 0.008, "chain_link_ms": 0.004, "chain_ratio": 1.5,
         "chain_spread": 0.02},
        {"family": "gemm bf16", "case": "M=4096", "status": "ok"},
    ]  # fmt: skip
    text = chain_table(rows)
    assert "M=4096" not in text
    assert "  1.50      2.00" in text  # (0.012 - 0.004) / (0.008 - 0.004)
    assert chain_table(rows[1:]) == ""


def test_bits_and_error_columns_use_the_reference_weights_when_copies_rotate(monkeypatch):
    """With several weight copies turned through by the timed calls, the bits and error
    columns still put ours, stock and the float64 reference on one weight: both errors are a
    rounding's (a reference on another copy would be off by the weights' own size), and on
    the CPU, where the mode runs stock's own kernels, 0 elements differ (elsewhere the
    mode's kernels round differently). Guard: the timed calls did turn through the copies
    (consecutive calls, different bits)."""
    from bi_rl import backends

    class Timed:
        median_s, spread, inner = 1e-3, 0.0, 1

    monkeypatch.setattr(kernels, "_copies", lambda nbytes, quick: 3)
    monkeypatch.setattr(kernels, "compare", lambda *a, **k: (Timed, Timed))
    monkeypatch.setattr(kernels, "compare_many", lambda sides, **k: dict.fromkeys(sides, Timed))
    case = next(kernels.gemm_cases(True))
    assert not np.array_equal(bits(case.ours()), bits(case.ours()))
    for only in ("gemm", "qmm"):
        rows = kernels.run(True, only=only)
        if backends.active().name == "cpu":
            assert all(r["differs_from_stock"] == 0 for r in rows), only
        assert all(r["ours_err"] < 5e-2 and r["stock_err"] < 5e-2 for r in rows), only
