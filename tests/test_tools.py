"""tools/: the developer scripts import on a machine without a GPU and answer --help.

They run on the device (the lead engineer's runs on the H200), so what can break here
unnoticed is an import or an argument parser after the library moves under them.
Property: every Python tool loads and its --help exits 0; each device run script prints
its usage with --help and refuses to start without an output directory.
"""

import subprocess

import pytest
from conftest import ROOT, load_script

PY_TOOLS = sorted(p.name for p in (ROOT / "tools").glob("*.py"))
SH_TOOLS = sorted(p.name for p in (ROOT / "tools").glob("*.sh"))
PARTS = {"cuda_device_run.sh": "roundtrip", "train_device_run.sh": "resume"}  # one part each


def test_the_tools_are_the_ones_documented():
    readme = (ROOT / "tools" / "README.md").read_text()
    assert sorted(PARTS) == SH_TOOLS, "every device run script has a test below"
    for name in [*PY_TOOLS, *SH_TOOLS]:
        assert f"`{name}`" in readme, f"tools/README.md does not document {name}"


@pytest.mark.parametrize("name", PY_TOOLS)
def test_python_tool_imports_and_answers_help(name, capsys):
    tool = load_script(f"tools/{name}")
    with pytest.raises(SystemExit) as e:
        tool.main(["--help"])
    assert e.value.code == 0
    assert "usage:" in capsys.readouterr().out


@pytest.mark.parametrize("name", SH_TOOLS)
def test_device_run_script_answers_help_and_needs_an_outdir(name):
    script = ROOT / "tools" / name
    ok = subprocess.run(["bash", str(script), "--help"], capture_output=True, text=True)
    assert ok.returncode == 0 and PARTS[name] in ok.stdout
    bad = subprocess.run(["bash", str(script)], capture_output=True, text=True, cwd=ROOT)
    assert bad.returncode == 2 and "usage:" in bad.stderr
