"""bi_rl.dist: rollouts and rescoring on several ranks give the single process's bytes.

Properties: the split of work among ranks is a pure function of the work and the number
of ranks; a rollout on 2 and on 3 local ranks (mlx.launch, ring backend) writes a log
byte-identical to one process's (bi-audit: IDENTICAL), with the sidecar proving the ranks
ran; a rank killed mid-run leaves a log marked incomplete that a run on another number of
ranks resumes to the same bytes; a rank that stops answering is detected within the rank
timeout, with the same outcome; ranks that disagree on the run are refused before any
output is touched; samples spooled by a killed run are used, not regenerated, on resume;
the rescoring report on 2 and 3 ranks equals the single process's field for field,
including the floating-point KL statistics of a log with a forged token.
"""

from __future__ import annotations

import os
import signal

import numpy as np
import orjson
import pytest
from dist_launch import finish, launched_ranks, mlx_launch, start_ranks, wait_for_lines
from log_tools import dump, load, read_lines, rechain, reseal_header, write_lines

from bi_rl.cli.audit import main as audit_main
from bi_rl.cli.rescore import main as rescore_main
from bi_rl.cli.rollout import main as rollout_main
from bi_rl.dist import EXIT_RANK_LOST, DistError, World, spool_path
from bi_rl.dist.split import share_order, share_units
from bi_rl.dist.spool import Spool, decode, encode
from bi_rl.dist.world import launch_backend
from bi_rl.rollout.engine import Sample
from bi_rl.rollout.log import read_log
from bi_rl.rollout.prompts import Prompt
from bi_rl.rollout.schema import LogError, Sidecar

# The embedded model and prompts at temperature 1: 64 prompts x 4 samples (long enough to
# stop a run mid-way at batch 1), and 24 prompts x 2 samples.
WORK, TOTAL = ["--n", "4", "--quiet"], 256
SMALL, SMALL_TOTAL = ["--n", "2", "--limit", "24", "--quiet"], 48
LAUNCH_TIMEOUT = 240


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The single-process log every distributed run must reproduce, byte for byte."""
    root = tmp_path_factory.mktemp("dist")
    out = root / "one.jsonl"
    assert rollout_main([*WORK, "--out", str(out)]) == 0
    return root, out


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    root = tmp_path_factory.mktemp("dist-small")
    out = root / "one.jsonl"
    assert rollout_main([*SMALL, "--out", str(out)]) == 0
    return root, out


def _last_run(log):
    return Sidecar.read(log).runs[-1]


def _identical(capsys, a, b) -> None:
    capsys.readouterr()
    rc = audit_main([str(a), str(b)])
    out = capsys.readouterr().out
    assert rc == 0 and "IDENTICAL" in out, out
    assert a.read_bytes() == b.read_bytes(), "the logs must be byte-identical"


# -- the split ----------------------------------------------------------------------------


def test_share_units_splits_by_prompt_then_by_unit():
    n = 4
    units = list(range(3, 40))  # a resumed run: units 0-2 are done
    for size in (1, 2, 3, 5):
        shares = share_units(units, n, size)
        assert sorted(u for s in shares for u in s) == units, "every unit exactly once"
        assert shares == share_units(list(reversed(units)), n, size), "a function of the set"
        assert all(s == sorted(s) for s in shares)
        for s in shares:  # whole prompts stay on one rank
            for other in shares:
                if other is not s:
                    assert not {u // n for u in s} & {u // n for u in other}
    assert share_units(units, n, 2)[0][:5] == [3, 8, 9, 10, 11], "prompts dealt in turn"
    # Both sides of the switch: as many prompts as ranks deals prompts; one fewer deals units.
    assert share_units(range(8), 4, 2) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert share_units(range(8), 4, 3) == [[0, 3, 6], [1, 4, 7], [2, 5]]
    assert share_units([], 4, 3) == [[], [], []]
    with pytest.raises(ValueError):
        share_units([1], 0, 2)


def test_share_order_cuts_contiguous_blocks():
    order = [5, 2, 7, 0, 1, 3, 6]
    assert share_order(order, 3) == [[5, 2, 7], [0, 1], [3, 6]]
    assert share_order(order, 1) == [order]
    assert share_order(order[:2], 3) == [[5], [2], []]


# -- the world ----------------------------------------------------------------------------


def test_a_world_of_one_returns_its_own_input():
    w = World()
    assert (w.rank, w.size) == (0, 1)
    assert w.exchange(b"abc", [1, 2]) == [(b"abc", [1, 2])]
    x = np.arange(5, dtype=np.uint32)
    assert (w.sum_u32(x) == x).all()
    w.agree(None, "nothing")
    with pytest.raises(DistError, match="^bad input$"):
        w.agree("bad input", "something")
    with pytest.raises(ValueError, match="timeout"):
        World(timeout=0)


def test_launch_backend_reads_the_launchers_environment(tmp_path):
    hosts = tmp_path / "hosts.json"
    hosts.write_text('[["127.0.0.1:5000"], ["127.0.0.1:5001"]]')
    empty = tmp_path / "empty.json"
    empty.write_text("")
    assert launch_backend({}) is None
    assert launch_backend({"MLX_RANK": "0", "MLX_HOSTFILE": str(hosts)}) == "ring"
    assert launch_backend({"MLX_RANK": "0", "MLX_HOSTFILE": str(empty)}) is None, "-n 1"
    nccl = {"MLX_RANK": "1", "MLX_WORLD_SIZE": "2", "NCCL_HOST_IP": "127.0.0.1"}
    assert launch_backend(nccl) == "nccl"
    assert launch_backend({"OMPI_COMM_WORLD_SIZE": "2"}) == "mpi"


# -- the spool ----------------------------------------------------------------------------


def _samples(log, units):
    header, records = read_log(log)
    n = header.run.n
    out = []
    for u in units:
        r = records[u]
        fields = {k: getattr(r, k) for k in ("prompt_index", "prompt_id", "sample", "finish")}
        lists = {k: list(getattr(r, k)) for k in ("tokens", "logprob_bits", "fingerprints")}
        out.append(Sample(**fields, **lists, prompt_tokens=r.prompt_tokens, stop=r.stop))
    prompts = [None] * header.run.prompt_count
    for r in records:
        prompts[r.prompt_index] = Prompt(r.prompt_id, r.prompt_tokens)
    return header, n, prompts, out


def test_spool_keeps_samples_bit_for_bit_and_refuses_what_does_not_check(reference, tmp_path):
    _, log = reference
    header, n, prompts, samples = _samples(log, [9, 3, 200])
    assert [vars(s) for s in decode(encode(samples, n), prompts, n, "r1")] == [
        vars(s) for s in samples
    ]
    out = tmp_path / "x.jsonl"
    spool = Spool(out, header, n)
    spool.append(samples[:2])
    spool.append(samples[2:])
    spool.close()
    got = Spool(out, header, n).read(header, prompts)
    assert sorted(got) == [3, 9, 200]
    assert all(vars(got[s.prompt_index * n + s.sample]) == vars(s) for s in samples)
    path = spool_path(out)
    lines = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(b"".join(lines) + lines[1][:30])  # a torn last line is dropped
    assert sorted(Spool(out, header, n).read(header, prompts)) == [3, 9, 200]
    assert path.read_bytes() == b"".join(lines), "the torn tail is cut off"
    bad = load(lines[2])
    bad["logprob_bits"][0] ^= 1
    path.write_bytes(b"".join([lines[0], lines[1], dump(bad)]))
    with pytest.raises(LogError, match=r"x\.jsonl\.pending:3: .*check failed"):
        Spool(out, header, n).read(header, prompts)
    other = load(lines[0])
    other["run"]["seed"] = 5
    path.write_bytes(dump(reseal_header(other, genesis=True)))
    with pytest.raises(LogError, match="another run.*run.seed"):
        Spool(out, header, n).read(header, prompts)


def test_one_process_resumes_a_killed_distributed_run_from_its_spool(reference, tmp_path, capsys):
    """A log with 10 records and 11 later samples spooled (as a killed run leaves them)
    resumes on one process to the reference bytes; the spooled samples are not made again."""
    _, ref = reference
    lines = read_lines(ref)
    out = write_lines(tmp_path / "part.jsonl", lines[:11])
    spooled = [12, *range(20, 30)]
    header, n, _, samples = _samples(ref, spooled)
    Spool(out, header, n).append(samples)
    assert rollout_main([*WORK, "--out", str(out), "--resume"]) == 0
    _identical(capsys, ref, out)
    assert not spool_path(out).exists(), "a finished run deletes its spool"
    _, records = read_log(ref)
    todo = [r for i, r in enumerate(records) if i >= 10 and i not in spooled]
    run = _last_run(out)
    assert run.generated_tokens == sum(len(r.tokens) for r in todo), "spooled samples reused"
    assert (run.ranks, run.resumed_from, run.incomplete) == (1, 10, None)


# -- several ranks ------------------------------------------------------------------------


def test_logs_are_identical_on_one_two_and_three_ranks(small, capsys):
    root, ref = small
    for ranks, batch in ((2, 4), (3, 3)):
        out = root / f"ranks{ranks}.jsonl"
        args = [*SMALL[:-1], "--batch-size", batch, "--out", out]
        _, stdout, stderr = finish(mlx_launch(ranks, "rollout", args, root), LAUNCH_TIMEOUT)
        assert f"wrote {SMALL_TOTAL} samples" in stderr and f"on {ranks} ranks" in stderr, stderr
        _identical(capsys, ref, out)
        run = _last_run(out)
        assert (run.ranks, run.records, run.incomplete) == (ranks, SMALL_TOTAL, None), run
        assert not spool_path(out).exists()


def test_a_killed_rank_leaves_an_incomplete_log_that_resumes_to_the_same_bytes(reference, capsys):
    root, ref = reference
    out = root / "killed.jsonl"
    args = [*WORK, "--batch-size", "1", "--out", out]
    launcher = mlx_launch(2, "rollout", args, root)
    have = wait_for_lines(out, 3, launcher, LAUNCH_TIMEOUT)
    ranks = launched_ranks(launcher)
    assert have >= 3 and 1 in ranks, (have, ranks)
    os.kill(ranks[1], signal.SIGKILL)
    _, _, stderr = finish(launcher, LAUNCH_TIMEOUT)
    kept = out.read_bytes().count(b"\n") - 1
    assert 1 <= kept < TOTAL, f"the kill must land mid-run ({kept} records)"
    assert "continue with --resume" in stderr and f"holds {kept} of {TOTAL}" in stderr, stderr
    run = _last_run(out)
    assert run.incomplete and run.records == kept and run.ranks == 2, run
    capsys.readouterr()
    assert audit_main([str(out)]) != 0, "an incomplete log never audits OK"
    assert "ends early" in capsys.readouterr().out
    # Resume on three ranks, another batch size.
    args = [*WORK[:-1], "--batch-size", 3, "--out", out, "--resume"]  # not --quiet
    launcher = mlx_launch(3, "rollout", args, root)
    _, _, stderr = finish(launcher, LAUNCH_TIMEOUT)
    assert f"at {kept} of {TOTAL} samples: wrote" in stderr and "on 3 ranks" in stderr, stderr
    _identical(capsys, ref, out)
    run = _last_run(out)
    assert (run.ranks, run.resumed_from, run.incomplete) == (3, kept, None)
    assert not spool_path(out).exists()


@pytest.mark.parametrize("command", ["rollout", "rescore"])
def test_a_sigterm_while_a_rank_reports_its_stop_does_not_cut_the_message(command, tmp_path):
    """mlx.launch sends SIGTERM to every rank once one fails. A rank that has recorded why
    its run stopped must still print it: here the launcher's SIGTERM lands while the stop is
    being reported (in a process of its own: with the default handler back it would die of
    the signal, silently, as a rank once did under load). Guard: the data-parallel path ran."""
    import subprocess
    import sys
    import textwrap

    out = tmp_path / "run.jsonl"
    script = textwrap.dedent(
        f"""
        import os, signal, sys
        from bi_rl import dist
        from bi_rl.cli import {command} as cli

        def failing(cfg, world, *rest):
            print("data-parallel path", file=sys.stderr)
            dist.stopping()
            raise dist.DistError("a rank went away; continue with --resume", lost=True)

        real = cli._stopped

        def report(*a):
            os.kill(os.getpid(), signal.SIGTERM)  # the launcher's, during the report
            return real(*a)

        dist.{command} = failing
        cli._stopped = report
        """
    )
    if command == "rollout":
        spool_path(out).write_bytes(b"")  # a data-parallel run's leftovers: the dist path
        script += f"rc = cli.main(['--quiet', '--out', {str(out)!r}, '--resume'])\n"
    else:
        script += "dist.World.join = lambda t: type('W', (), {'size': 2, 'rank': 0})()\n"
        script += f"rc = cli.main([{str(out)!r}])\n"
        out.write_text("x")  # the log to rescore, never read: the run is stubbed

    def run(after: str = ""):
        return subprocess.run(
            [sys.executable, "-c", script + after + "sys.exit(rc)\n"],
            capture_output=True,
            text=True,
            timeout=120,
        )

    done = run()
    assert "data-parallel path" in done.stderr, done.stderr
    # rollout: a lost rank's own status; rescore: its one error status
    assert done.returncode == (EXIT_RANK_LOST if command == "rollout" else 2), done
    assert "error: a rank went away; continue with --resume" in done.stderr, done.stderr
    # control: the same signal once the command has returned kills the process outright
    killed = run("os.kill(os.getpid(), signal.SIGTERM)\n")
    assert killed.returncode == -signal.SIGTERM, killed


def test_a_sigterm_while_rank_0_begins_its_stop_still_records_the_log(tmp_path):
    """mlx.launch's SIGTERM often lands while rank 0 is handling the error that stops it (a
    peer gone), and Python raises it at the first call there. The stop must still close the
    log, record the incomplete run and say how far it got, naming the first error. Here (a
    process of its own, a world of one on the data-parallel path) two units are written, a
    DistError stops the run and the SIGTERM is raised inside the stop's first call. Guard:
    the Terminated was raised there."""
    import subprocess
    import sys
    import textwrap

    out = tmp_path / "run.jsonl"
    script = textwrap.dedent(
        f"""
        import importlib, os, signal, sys
        from bi_rl import dist
        from bi_rl.cli import rollout as cli

        D = importlib.import_module("bi_rl.dist.rollout")
        real_generate, real_stopping = D._generate, D.stopping

        def generate(world, p, mine, merger, progress):
            real_generate(world, p, mine[:2], merger, progress)
            raise dist.DistError("a rank went away", lost=True)

        def stopping():
            try:
                os.kill(os.getpid(), signal.SIGTERM)  # the launcher's
                (lambda: None)()  # a call: where Python runs the handler
            except dist.Terminated:
                print("terminated raised in the stop", file=sys.stderr)
                raise
            real_stopping()

        D._generate, D.stopping = generate, stopping
        dist.spool_path({str(out)!r}).write_bytes(b"")  # the data-parallel path
        args = ["--quiet", "--n", "1", "--limit", "6", "--batch-size", "1", "--out", {str(out)!r}]
        sys.exit(cli.main(args))
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert "terminated raised in the stop" in done.stderr, done.stderr
    assert done.returncode == EXIT_RANK_LOST, done
    assert "error: a rank went away; the log holds 2 of 6 records" in done.stderr, done.stderr
    run = _last_run(out)
    assert run.incomplete and run.records == 2, run


def test_a_rank_that_stops_answering_is_detected_and_the_log_resumes(reference, capsys):
    """A host that goes away without closing its connections looks like a rank that stops
    (SIGSTOP): rank 0 must give up after --rank-timeout, record the log as incomplete and
    exit with EXIT_RANK_LOST."""
    root, ref = reference
    out = root / "silent.jsonl"
    args = [*WORK, "--batch-size", "1", "--rank-timeout", "4", "--out", out]
    procs = start_ranks(2, "rollout", args, root)
    try:
        have = wait_for_lines(out, 3, procs[0], LAUNCH_TIMEOUT)
        assert have >= 3, have
        os.kill(procs[1].pid, signal.SIGSTOP)
        rc, _, stderr = finish(procs[0], 60)
    finally:
        procs[1].kill()
        procs[1].communicate()
    assert rc == EXIT_RANK_LOST, (rc, stderr)
    assert "no answer from the other ranks for 4 s" in stderr, stderr
    assert "continue with --resume" in stderr, stderr
    kept = out.read_bytes().count(b"\n") - 1
    assert kept < TOTAL and _last_run(out).incomplete, _last_run(out)
    assert rollout_main([*WORK, "--out", str(out), "--resume"]) == 0
    _identical(capsys, ref, out)


def test_ranks_that_disagree_on_the_run_are_refused_before_any_output(small):
    root, _ = small
    out = root / "disagree.jsonl"
    procs = start_ranks(
        2, "rollout", [*SMALL, "--out", out], root, per_rank=lambda r: ["--seed", "7"] if r else []
    )
    results = [finish(p, LAUNCH_TIMEOUT) for p in procs]
    assert [rc for rc, _, _ in results] == [1, 1], results
    err0 = results[0][2]
    assert "rank 1 differs from rank 0 in run.seed" in err0, err0
    assert results[1][2] == "", "rank 0 speaks for an error every rank saw"
    assert not out.exists(), "nothing was written"


def test_rescoring_reports_are_equal_on_one_two_and_three_ranks(small, capsys):
    """A log with one forged logprob (hash chain recomputed), so the report carries a
    divergence and nonzero KL statistics that each rank count must reproduce exactly."""
    root, ref = small
    lines = read_lines(ref)
    rec = load(lines[38])
    rec["logprob_bits"][1] ^= 1 << 12
    lines[38] = dump(rec)
    forged = write_lines(root / "forged.jsonl", rechain(lines))
    capsys.readouterr()
    assert rescore_main([str(forged), "--json"]) == 1
    one = orjson.loads(capsys.readouterr().out)
    assert one["report"]["differing"] == 1 and one["report"]["k1_mean"] != 0, one["report"]
    assert one["report"]["first_divergence"]["sample"] == 37
    for ranks in (2, 3):
        report = root / f"report{ranks}.json"
        launcher = mlx_launch(ranks, "rescore", [forged, "--report", report], root)
        _, stdout, stderr = finish(launcher, LAUNCH_TIMEOUT)
        assert "MISMATCH: 1 of" in stdout, (stdout, stderr)
        many = orjson.loads(report.read_bytes())
        assert many["report"] == one["report"], "the report must not depend on the ranks"
        assert many["composition"]["ranks"] == ranks
        assert many["composition"]["batches"] >= one["composition"]["batches"]


def test_distributed_rescoring_builds_the_concatenated_projections_once(small, monkeypatch):
    """With concatenation asked for (BI_RL_CONCAT_PROJECTIONS=1), a rank whose share takes
    several rounds builds each sibling set once for the run, not once a round; the guard:
    the share did take several rounds, and the report is the one without concatenation
    (the mode gives a concatenated set its members' bits)."""
    import importlib

    import bi_rl.concat as C
    from bi_rl.fusion import sibling_sets
    from bi_rl.score.rescore import RescoreConfig

    D = importlib.import_module("bi_rl.dist.rescore")  # (bi_rl.dist.rescore is the function)
    _, ref = small
    cfg = RescoreConfig(log=str(ref), batch_size=2, mode="strict")
    plain = D.rescore(cfg, World())
    builds, rounds = [], []
    real_init, real_rounds = C._Product.__init__, D._rounds
    monkeypatch.setattr(C._Product, "__init__", lambda s, m: builds.append(1) or real_init(s, m))
    monkeypatch.setattr(D, "_rounds", lambda *a: rounds.append(a[2]) or real_rounds(*a))
    monkeypatch.setenv(C.CONCAT_ENV, "1")
    joined = D.rescore(cfg, World())
    (block,) = rounds
    assert len(block) > 2 * D.ROUND_BATCHES, "the share must take several rounds"
    model = D.prepare(cfg).model
    assert len(builds) == len(list(sibling_sets(model))) > 0, len(builds)
    assert joined.report == plain.report


@pytest.mark.parametrize("rank", [0, 1])
def test_ranks_of_a_differing_rescoring_leave_only_after_rank_0_reported(
    rank, tmp_path, capsys, monkeypatch
):
    """A launcher terminates every rank once one exits nonzero, and a log that differs makes
    every rank's status nonzero: so a rank other than 0 waits for rank 0 (leave_together)
    before it returns, and rank 0 lets the others go only once its report is written and
    printed. Guard: the data-parallel path ran (the stubbed dist.rescore was called)."""
    import importlib

    from bi_rl import dist

    cli = importlib.import_module("bi_rl.cli.rescore")
    events = []

    class Result:
        ok = False

        def to_json(self):
            return {"report": {"differing": 1}}

    class FakeWorld:
        size = 2

        def __init__(self):
            self.rank = rank

        def leave_together(self):
            events.append(("leave", capsys.readouterr().out, report.exists()))

    def fake_rescore(cfg, world):
        events.append("dist.rescore")
        return Result()

    log, report = tmp_path / "run.jsonl", tmp_path / "report.json"
    log.write_text("x")  # never read: the run is stubbed
    monkeypatch.setattr(dist.World, "join", staticmethod(lambda timeout: FakeWorld()))
    monkeypatch.setattr(dist, "rescore", fake_rescore)
    monkeypatch.setattr(cli, "render", lambda result: "MISMATCH: 1 of 1")
    assert cli.main([str(log), "--report", str(report)]) == 1
    assert events[0] == "dist.rescore" and len(events) == 2, events
    _, printed, written = events[1]
    if rank == 0:
        assert "MISMATCH: 1 of 1" in printed and written, "reported before the others leave"
    else:
        assert printed == "" and not written, "rank 1 reports nothing and waits"
