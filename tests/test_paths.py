"""Output paths are checked before a command works or writes (bi_rl.rollout.paths).

Properties: check_output passes a new file in a new folder (and creates nothing), an existing
plain file and an existing log where logs are the output; it refuses, with one line naming
the option and the path, a directory, a special file, a folder under a file, the same file as
one the command uses (by name, by another spelling, through a symbolic and a hard link), and
where logs are not the output, a rollout log and a log's sidecar; a sidecar-named file whose
log is not a rollout log passes. Every refused file keeps its bytes.
"""

import os

import pytest
from log_tools import ADDITION_ROWS, make_log
from tiny_models import build_model, write_jsonl

from bi_rl.rollout.paths import OutputError, check_output, is_rollout_file, make_parent
from bi_rl.rollout.schema import Sidecar


@pytest.fixture(scope="module")
def log(tmp_path_factory):
    root = tmp_path_factory.mktemp("paths")
    model = build_model(root / "model")
    prompts = write_jsonl(root / "prompts.jsonl", ADDITION_ROWS)
    path = make_log(root / "run.jsonl", model, prompts, n=1, max_tokens=4, limit=2)
    assert Sidecar.path(path).is_file()
    return path


def _refused(path, *needles, **kw):
    before = path.read_bytes() if os.path.isfile(path) else None
    with pytest.raises(OutputError) as e:
        check_output(path, "--report", **kw)
    msg = str(e.value)
    assert "\n" not in msg and "--report" in msg, msg
    assert repr(str(path)) in msg, msg
    for n in needles:
        assert n in msg, msg
    if before is not None:
        assert path.read_bytes() == before
    return msg


def test_new_and_plain_files_pass_and_nothing_is_created(tmp_path):
    new = tmp_path / "a" / "b" / "report.json"
    assert check_output(new, "--report") == new
    assert not (tmp_path / "a").exists()
    make_parent(new)
    assert new.parent.is_dir() and not new.exists()
    plain = tmp_path / "old.json"
    plain.write_text("{}")
    assert check_output(plain, "--report") == plain


def test_where_an_output_cannot_go(tmp_path):
    _refused(tmp_path, "is a directory")
    blocker = tmp_path / "file"
    blocker.write_text("x")
    _refused(blocker / "sub" / "r.json", "cannot create the output directory", repr(str(blocker)))
    if os.path.exists("/dev/null"):
        with pytest.raises(OutputError, match="is not a regular file"):
            check_output("/dev/null", "--report")


def test_a_file_the_command_uses_is_refused_in_every_spelling(log, tmp_path):
    reads = [(log, "the log being rescored")]
    _refused(log, "is also the log being rescored", reads=reads)
    other = log.parent / "." / log.name
    msg = _refused(other, "is also the log being rescored", reads=reads)
    assert "choose another file" in msg
    sym = tmp_path / "sym.jsonl"
    sym.symlink_to(log)
    _refused(sym, "is also the log being rescored", reads=reads)
    hard = tmp_path / "hard.jsonl"
    os.link(log, hard)
    _refused(hard, "is also the log being rescored", reads=reads)


def test_logs_and_sidecars_are_refused_unless_logs_are_the_output(log, tmp_path):
    assert is_rollout_file(log) == "a bi-rl rollout log"
    side = Sidecar.path(log)
    assert is_rollout_file(side) == f"the sidecar of rollout log {str(log)!r}"
    _refused(log, "is a bi-rl rollout log; choose another file")
    _refused(side, "is the sidecar of rollout log")
    assert check_output(log, "--out", log_ok=True) == log
    # a file merely named like a sidecar, beside no rollout log, is an ordinary file
    plain = tmp_path / "notes.txt"
    plain.write_text("x")
    named = tmp_path / "notes.txt.run.json"
    named.write_text("{}")
    assert is_rollout_file(named) is None and is_rollout_file(plain) is None
    assert check_output(named, "--report") == named
