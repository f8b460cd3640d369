"""bi-verify's checks find variance when it is there, and the CLI reports and exits accordingly."""

from __future__ import annotations

from types import SimpleNamespace

import mlx.core as mx
import orjson
import pytest

from bi_rl import backends
from bi_rl.backends import Backend
from bi_rl.cli import verify as cli
from bi_rl.verify import STOCK
from bi_rl.verify.attention import attention_check
from bi_rl.verify.gemm import gemm_check, grouped_check, quantized_check


def variant_ops():
    """Stock ops that change a low bit when the batch reaches 8 rows or the keys are padded:
    the kind of switch a real kernel makes at a size threshold."""
    nudge = lambda y, on: y * 1.01 if on else y

    def linear(x, w, bias=None):
        return nudge(STOCK.linear(x, w, bias), x.shape[0] >= 8)

    def sdpa(q, k, v, scale, mask=None, sinks=None):
        return nudge(STOCK.sdpa(q, k, v, scale, mask, sinks), k.shape[0] > 1)

    def qmm(x, *args):
        return nudge(STOCK.quantized_matmul(x, *args), x.shape[0] >= 8)

    return SimpleNamespace(name="variant", linear=linear, sdpa=sdpa, quantized_matmul=qmm)


def test_gemm_check_catches_a_switch_at_batch_8_and_not_before():
    check = gemm_check(variant_ops(), "linear", "bfloat16", mx.bfloat16, 64, 32, (1, 7, 8, 9), 0)
    assert check.status == "variant"
    assert check.detail == "row 0 in a batch of 8", "batch 7 must pass, batch 8 must fail"
    clean = gemm_check(STOCK, "linear", "bfloat16", mx.bfloat16, 64, 32, (1, 7, 8, 9), 0)
    assert clean.status == "ok" and clean.compared > 0


def test_quantized_check_catches_a_switch_at_batch_8():
    check = quantized_check(variant_ops(), "float32", mx.float32, 128, 32, 4, 64, (1, 7, 8), 0)
    assert check.status == "variant" and "batch of 8" in check.detail


def _grouped_ops(nudge_member: int, from_rows: int):
    """Stock grouped ops that change member `nudge_member`'s low bits from `from_rows` rows:
    a grouped launch that disagrees with the member's own op (nudge from 1 row) or switches
    at a batch size (from 8)."""

    def nudged(outs, rows):
        return [o * 1.01 if i == nudge_member and rows >= from_rows else o
                for i, o in enumerate(outs)]  # fmt: skip

    return SimpleNamespace(
        name="grouped variant",
        linear=STOCK.linear,
        quantized_matmul=STOCK.quantized_matmul,
        grouped_linear=lambda x, ws: nudged(STOCK.grouped_linear(x, ws), x.shape[0]),
        grouped_quantized_matmul=lambda x, ms, g, b: nudged(
            STOCK.grouped_quantized_matmul(x, ms, g, b), x.shape[0]
        ),
    )


@pytest.mark.parametrize("bits", [None, 4])
def test_grouped_check_compares_each_member_with_its_own_op(bits):
    """The grouped check fails where a member's grouped rows are not its own op's bits (from
    one row: every row differs) or switch at a batch size (batch 7 passes, 8 fails), and
    passes on stock's members one by one; the members are compared side by side."""
    args = ("bfloat16", mx.bfloat16, 128, (64, 32, 32), (1, 7, 8, 9), 0, bits, 64)
    assert grouped_check(STOCK, *args).status == "ok"
    always = grouped_check(_grouped_ops(2, 1), *args)
    assert always.status == "variant" and always.detail == "row 0 in a batch of 1"
    switch = grouped_check(_grouped_ops(1, 8), *args)
    assert switch.status == "variant" and switch.detail == "row 0 in a batch of 8"
    assert switch.family == "grouped" and "N=64+32+32" in switch.case


def test_a_control_check_stops_at_its_first_difference_and_the_mode_counts_every_row():
    from bi_rl.verify.sweep import run_one

    calls = []

    def counting(first_difference):
        ops = variant_ops()
        inner = ops.linear
        ops.linear = lambda x, *a: calls.append(x.shape[0]) or inner(x, *a)
        ops.first_difference = first_difference
        return ops

    batches = (1, 7, 8, 9, 16)
    fn = lambda ops: gemm_check(ops, "linear", "bfloat16", mx.bfloat16, 64, 32, batches, 0)
    full = run_one("gemm linear bfloat16 K=64 N=32", fn, counting(False))
    ran_in_full = list(calls)
    calls.clear()
    stopped = run_one("gemm linear bfloat16 K=64 N=32", fn, counting(True))
    assert full.status == stopped.status == "variant"
    assert not full.stopped and stopped.stopped
    # The full check walks the batches upward and meets the switch at 8; the control walks
    # them from the largest down, so after the rows alone it makes one call, at 16.
    assert full.detail == "row 0 in a batch of 8" and stopped.detail == "row 0 in a batch of 16"
    assert set(ran_in_full) == {1, 7, 8, 9, 16}
    assert set(calls) == {1, 16} and calls[-1] == 16
    assert 0 < stopped.differing < full.differing and stopped.compared < full.compared
    # An invariant op set runs to the end whichever way the flag is set.
    clean_ops = SimpleNamespace(name="clean", linear=STOCK.linear, first_difference=True)
    clean = run_one("gemm linear bfloat16 K=64 N=32", fn, clean_ops)
    assert clean.status == "ok" and not clean.stopped and clean.compared == full.compared


def test_a_control_check_goes_on_past_a_batch_size_where_the_op_raises():
    """Stock ops that fail at the largest batch: the control still finds the variance at a
    smaller one and names the failure; where nothing differs the failure is the result; the
    mode's checks raise at once."""
    from bi_rl.verify.sweep import run_one

    def failing(first_difference, variant=True):
        ops = variant_ops() if variant else SimpleNamespace(name="clean", linear=STOCK.linear)
        inner = ops.linear

        def linear(x, *a):
            if x.shape[0] == 16:
                raise RuntimeError("cuGraphAddKernelNode failed: invalid argument")
            return inner(x, *a)

        ops.linear, ops.first_difference = linear, first_difference
        return ops

    fn = lambda ops: gemm_check(ops, "linear", "bfloat16", mx.bfloat16, 64, 32, (1, 8, 16), 0)
    control = run_one("gemm linear", fn, failing(True))
    assert control.status == "variant" and control.detail == "row 0 in a batch of 8"
    assert control.where[0] == (
        "a batch of 16 raised RuntimeError: cuGraphAddKernelNode failed: invalid argument"
    )
    clean = run_one("gemm linear", fn, failing(True, variant=False))
    assert clean.status == "error" and "invalid argument" in clean.detail
    mode = run_one("gemm linear", fn, failing(False))
    assert mode.status == "error" and mode.compared == 0


def test_attention_check_catches_variance_under_left_padding_only():
    check = attention_check(
        variant_ops(), "float32", mx.float32, 257, (1, 8, 9), 64, 4, 2, (0, 37), 0, 16
    )
    assert check.status == "variant"
    assert all("batch of 3" in w for w in check.where), check.where
    assert check.compared > check.differing > 0


@pytest.mark.skipif(backends.default_name() != "cpu", reason="the stock finding is the CPU's")
def test_cli_quick_passes_on_cpu_and_reports_the_stock_finding(capsys, tmp_path):
    out = tmp_path / "new" / "report.json"  # its folder is made when the report is written
    assert cli.main(["--quick", "--only", "quantized", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "PASS: the mode is batch-invariant" in text
    assert "Finding: stock MLX was itself batch-invariant on the cpu backend" in text
    report = orjson.loads(out.read_bytes())
    assert report["passed"] and report["backend"] == "cpu"
    assert len(report["mode"]) == len(report["stock"]) == 9
    assert all(c["compared"] > 0 and c["differing"] == 0 for c in report["mode"])


def test_jobs_run_the_same_checks_in_worker_processes(capsys, tmp_path, monkeypatch):
    serial, parallel = tmp_path / "serial.json", tmp_path / "parallel.json"
    argv = ["--quick", "--only", "quantized"]
    assert cli.main([*argv, "--json", str(serial)]) == 0

    def in_process(*a, **k):
        raise AssertionError("--jobs 2 ran the sweep in this process")

    monkeypatch.setattr(cli.verify, "run", in_process)  # guard: the workers must run it
    assert cli.main([*argv, "--jobs", "2", "--json", str(parallel)]) == 0
    a, b = (orjson.loads(p.read_bytes()) for p in (serial, parallel))
    for side in ("mode", "stock"):
        assert len(a[side]) == 9
        assert [
            (c["case"], c["dtype"], c["compared"], c["differing"], c["status"]) for c in a[side]
        ] == [(c["case"], c["dtype"], c["compared"], c["differing"], c["status"]) for c in b[side]]
    assert cli.main([*argv, "--jobs", "0"]) == 2
    assert "--jobs must be >= 1" in capsys.readouterr().err


def test_progress_without_verbose_is_throttled_not_silent(capsys, monkeypatch):
    """Without -v a long sweep still says how far it got (stderr), at most every
    PROGRESS_EVERY_S; with 0 s every check, with an hour none in a short sweep."""
    monkeypatch.setattr(cli, "PROGRESS_EVERY_S", 0.0)
    assert cli.main(["--quick", "--only", "quantized", "--no-control"]) == 0
    lines = [x for x in capsys.readouterr().err.splitlines() if "checks done" in x]
    assert len(lines) == 9 and lines[-1].startswith("bi-verify: 9 checks done; last ")
    monkeypatch.setattr(cli, "PROGRESS_EVERY_S", 3600.0)
    assert cli.main(["--quick", "--only", "quantized", "--no-control"]) == 0
    assert "checks done" not in capsys.readouterr().err


def test_cli_exits_nonzero_where_the_backend_has_no_kernels(capsys):
    with backends.use(Backend(name="cuda")):
        assert cli.main(["--quick", "--only", "gemm", "--no-control"]) == 1
    text = capsys.readouterr().out
    assert "FAIL" in text and "REFUSED" in text and "on the cuda backend" in text


def test_reports_name_the_source_digest(tmp_path, monkeypatch):
    """The digest identifies the code that ran where .git is absent or stale (device runs)."""
    from bi_rl import _source

    digest = _source.source_digest()
    assert len(digest) == 16 and int(digest, 16) >= 0
    _source.source_digest.cache_clear()
    assert _source.source_digest() == digest  # a pure function of the files
    real = _source.Path.read_bytes
    edited = lambda p: real(p) + (b"#" if p.name == "mode.py" else b"")  # noqa: E731
    monkeypatch.setattr(_source.Path, "read_bytes", edited)
    _source.source_digest.cache_clear()
    assert _source.source_digest() != digest  # one edited file moves it
    monkeypatch.undo()
    _source.source_digest.cache_clear()


def test_warmup_runs_the_model_at_each_size_and_needs_no_gpu(capsys, tmp_path, monkeypatch):
    """bi-verify --warmup on the CPU: nothing for NVRTC to compile, the model run at 1, 2 and
    3 rows (prefill, decode, rescoring); a bad model is one line and exit 2."""
    from bi_rl.verify import warmup as warmup_mod

    sizes = []
    real = warmup_mod.Engine

    def engine(model, tok, sampler, config):
        sizes.append(config.batch_size)
        return real(model, tok, sampler, config)

    monkeypatch.setattr(warmup_mod, "Engine", engine)
    out = tmp_path / "w.json"
    argv = ["--warmup", "--batch-size", "3", "--prefill-chunk", "5", "--json", str(out)]
    assert cli.main(argv) == 0
    text = capsys.readouterr().out
    assert "embedded:tiny-adder on the cpu backend" in text
    assert "warm: 0 bi-rl GEMM kernels compiled now" in text and "[1, 3] rows" in text
    assert sizes == [1, 3]
    assert orjson.loads(out.read_bytes())["warmup"]["batch_sizes"] == [1, 3]
    assert cli.main(["--warmup", "--model", str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("bi-verify: error: model") and err.count("\n") == 1


def test_log_keeps_each_check_and_resume_runs_only_the_missing_ones(tmp_path, monkeypatch):
    """A sweep cut short resumes from its log: the report equals an uninterrupted run's, the
    checks already logged are not run again, and a line cut off mid-write is dropped."""
    from bi_rl.verify import sweep

    argv = ["--quick", "--only", "quantized"]
    whole, log = tmp_path / "whole.json", tmp_path / "sweep.jsonl"
    assert cli.main([*argv, "--json", str(whole)]) == 0
    assert cli.main([*argv, "--log", str(log)]) == 0
    lines = log.read_bytes().splitlines(keepends=True)
    assert len(lines) == 1 + 18  # the header, then 9 checks of each op set
    log.write_bytes(b"".join(lines[:6]) + lines[6][:25])  # killed while writing the 6th check
    ran = []
    real = sweep.run_one
    monkeypatch.setattr(
        sweep, "run_one", lambda label, fn, ops: ran.append(label) or real(label, fn, ops)
    )
    resumed = tmp_path / "resumed.json"
    assert cli.main([*argv, "--log", str(log), "--resume", "--json", str(resumed)]) == 0
    assert len(ran) == 18 - 5
    a, b = (orjson.loads(p.read_bytes()) for p in (whole, resumed))
    for side in ("mode", "stock"):
        assert [(c["case"], c["compared"], c["differing"]) for c in a[side]] == [
            (c["case"], c["compared"], c["differing"]) for c in b[side]
        ]
    assert len(log.read_bytes().splitlines()) == 19 and log.read_bytes().endswith(b"\n")


def test_log_is_never_overwritten_or_mixed_with_another_sweep(tmp_path, capsys):
    log = tmp_path / "sweep.jsonl"
    assert cli.main(["--quick", "--only", "quantized", "--no-control", "--log", str(log)]) == 0
    before = log.read_bytes()
    capsys.readouterr()
    assert cli.main(["--quick", "--only", "quantized", "--log", str(log)]) == 2
    assert "exists: --resume continues that sweep" in capsys.readouterr().err
    assert cli.main(["--quick", "--only", "gemm", "--log", str(log), "--resume"]) == 2
    err = capsys.readouterr().err
    assert "belongs to another sweep (only 'quantized', here 'gemm')" in err
    assert log.read_bytes() == before
    assert cli.main(["--quick", "--resume"]) == 2
    assert "--resume needs --log" in capsys.readouterr().err
    bad = tmp_path / "other.jsonl"
    bad.write_text("not a log\n")
    assert cli.main(["--quick", "--log", str(bad), "--resume"]) == 2
    assert "is not a bi-verify log" in capsys.readouterr().err


def test_outputs_that_cannot_be_written_stop_the_sweep_before_it_starts(tmp_path, capsys):
    """--json onto --log's file, onto a rollout log, or under a file: one line, exit 2, nothing
    run (no header printed) and no file touched."""
    log = tmp_path / "sweep.jsonl"
    fake = tmp_path / "run.jsonl"  # the first line is what marks a rollout log
    fake.write_bytes(b'{"digest":"0","format":"bi-rl.rollout","version":1}\n')
    blocker = tmp_path / "file"
    blocker.write_text("x")
    for argv, says in (
        (["--json", str(log), "--log", str(log)], "is also the --log file"),
        (["--json", str(fake)], "is a bi-rl rollout log"),
        (["--log", str(fake)], "--log"),
        (["--json", str(blocker / "r.json")], "cannot create the output directory"),
        (["--json", str(tmp_path)], "is a directory"),
    ):
        assert cli.main(["--quick", "--only", "gemm", *argv]) == 2
        cap = capsys.readouterr()
        assert cap.out == "", cap.out
        err = cap.err.strip()
        assert err.startswith("bi-verify: error: ") and "\n" not in err and says in err, err
    assert not log.exists() and fake.read_bytes().startswith(b'{"digest":"0"')
    assert blocker.read_text() == "x"


def test_one_sweep_writes_a_log_at_a_time(tmp_path):
    """A second writer of a sweep log (here a second open of it while the first holds it) is
    refused before it reads or trims the log; after the first closes, resume works."""
    from bi_rl.verify.sweeplog import SweepLog, SweepLogError

    path = tmp_path / "sweep.jsonl"
    meta = {"source": "s", "sweep": "quick"}
    first = SweepLog(path, meta, resume=False)
    path.write_bytes(path.read_bytes() + b'{"opset": "mo')  # a torn line: the first is mid-write
    before = path.read_bytes()
    with pytest.raises(SweepLogError, match="another bi-verify is writing this log"):
        SweepLog(path, meta, resume=True)
    assert path.read_bytes() == before
    first.close()
    second = SweepLog(path, meta, resume=True)
    second.close()
    assert path.read_bytes() == before[: before.rfind(b"\n") + 1]


def test_progress_shows_a_failing_check_at_once(capsys):
    say = []
    progress = cli.every(3600.0, say.append)
    progress("bi-rl mode: gemm a: ok (0.1s)")
    progress("bi-rl mode: gemm b: variant (0.1s)")
    assert len(say) == 1 and "gemm b: variant" in say[0]


def test_resume_with_workers_completes_the_same_report(tmp_path):
    argv = ["--quick", "--only", "quantized"]
    whole, log, resumed = tmp_path / "whole.json", tmp_path / "s.jsonl", tmp_path / "r.json"
    assert cli.main([*argv, "--json", str(whole), "--log", str(log)]) == 0
    lines = log.read_bytes().splitlines(keepends=True)
    log.write_bytes(b"".join(lines[:12]))  # the header and 11 of 18 checks
    assert (
        cli.main([*argv, "--jobs", "2", "--log", str(log), "--resume", "--json", str(resumed)]) == 0
    )
    a, b = (orjson.loads(p.read_bytes()) for p in (whole, resumed))
    for side in ("mode", "stock"):
        assert [c["case"] for c in a[side]] == [c["case"] for c in b[side]]
        assert [c["compared"] for c in a[side]] == [c["compared"] for c in b[side]]
    assert len(log.read_bytes().splitlines()) == 19


def test_workers_take_the_checks_that_share_kernels_as_one_set():
    """MLX keeps a CUDA kernel it compiled in the compiling process, so the sweep hands each
    worker whole sets of checks that launch the same kernels: attention of one dtype, head
    dim and window (any key count); every GEMM and quantized check alone. Every unfinished
    check is in exactly one set, plan order within a set, the largest sets first."""
    from bi_rl.verify import sweep

    labels = [(i, label) for i, label, _ in sweep._entries(False, False, None)]
    names = dict(labels)
    done = {("bi-rl mode", labels[0][0]): None, ("stock MLX", labels[-1][0]): None}
    sets = sweep.work_sets(["bi-rl mode", "stock MLX"], labels, done)
    runs = [(name, i) for name, indices in sets for i in indices]
    assert sorted(runs) == sorted(
        (n, i) for n in ("bi-rl mode", "stock MLX") for i, _ in labels if (n, i) not in done
    ), "every check still to run, once, and none already done"
    assert [len(ix) for _, ix in sets] == sorted((len(ix) for _, ix in sets), reverse=True)
    for _, indices in sets:
        assert indices == sorted(indices)
        keys = {sweep.affinity(names[i]) for i in indices}
        assert len(keys) == 1, f"one kernel set per worker set: {keys}"
    a = "attention bfloat16 D=128 keys=255"
    assert sweep.affinity(a) == sweep.affinity("attention bfloat16 D=128 keys=4097")
    assert sweep.affinity(a) != sweep.affinity("attention bfloat16 D=64 keys=255")
    assert sweep.affinity(a) != sweep.affinity("attention float16 D=128 keys=255")
    assert sweep.affinity("attention bfloat16 D=128 window=100 keys=99") != sweep.affinity(a)
    gemm = [label for _, label in labels if label.startswith(("gemm", "quantized"))]
    assert len({sweep.affinity(g) for g in gemm}) == len(gemm), "GEMM checks stay apart"
    sizes = [len(ix) for name, ix in sets if names[ix[0]].startswith("attention")]
    assert min(sizes) > 1, "the attention checks were grouped (the negative: all alone)"


def test_a_worker_that_dies_mid_set_keeps_what_it_finished(monkeypatch):
    """A set whose worker raises after its first check: that check is reported as it ran, the
    set's other checks as failed with the worker's error, and every other set runs on."""
    from concurrent.futures import ThreadPoolExecutor

    from bi_rl.verify import sweep

    class Threads(ThreadPoolExecutor):  # the executor's contract without processes
        def __init__(self, max_workers, mp_context=None):
            super().__init__(max_workers)

    labels = [(i, f"check {i}") for i in range(4)]
    monkeypatch.setattr(sweep, "_entries", lambda *a: [(i, lab, None) for i, lab in labels])
    monkeypatch.setattr(sweep, "work_sets", lambda o, lb, d: [("m", [0, 1, 2]), ("m", [3])])
    monkeypatch.setattr(sweep, "ProcessPoolExecutor", Threads)

    def worker(opset, indices, quick, large, results):
        for i in indices:
            if i == 1:
                raise RuntimeError("worker lost")
            results.put((opset, i, sweep._failed(f"c{i}", "ok", "").as_dict(), 0.0))

    monkeypatch.setattr(sweep, "_worker", worker)
    recorded = []
    out = sweep.run_parallel(["m"], True, 2, record=lambda *r: recorded.append(r[1]))["m"]
    assert [c.status for c in out] == ["ok", "error", "error", "ok"]
    assert "worker lost" in out[1].detail and "worker lost" in out[2].detail
    assert sorted(recorded) == [0, 1, 2, 3], "each check recorded once"


def test_jobs_default_to_one_on_the_cpu_and_to_workers_on_a_gpu(monkeypatch):
    """Without --jobs the CPU sweep runs in this process (its checks are compute); a GPU's
    takes up to GPU_JOBS workers (its sweep is mostly first-use compiles), never more than
    the host has CPUs."""
    monkeypatch.setattr(cli.os, "cpu_count", lambda: 16)
    assert cli.default_jobs("cpu") == 1
    assert cli.default_jobs("cuda") == cli.GPU_JOBS == 8
    monkeypatch.setattr(cli.os, "cpu_count", lambda: 2)
    assert cli.default_jobs("cuda") == 2
    monkeypatch.setattr(cli.os, "cpu_count", lambda: None)
    assert cli.default_jobs("metal") == 1
    ran = []
    monkeypatch.setattr(cli.verify, "run", lambda o, *a: ran.append(o.name) or [])
    monkeypatch.setattr(cli.verify, "run_parallel", lambda *a: pytest.fail("workers on the CPU"))
    cli.main(["--quick", "--only", "quantized", "--no-control"])
    assert ran == ["bi-rl mode"], "the CPU's default: the sweep in this process"
    with backends.use(Backend(name="cuda")):  # chosen here alone: workers would not see it
        cli.main(["--quick", "--only", "quantized", "--no-control"])
    assert ran == ["bi-rl mode"] * 2, "a backend of this process's own runs here too"
