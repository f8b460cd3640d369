"""tools/: the developer scripts import on a machine without a GPU and answer --help.

They run on the device (the lead engineer's runs on the H200), so what can break here
unnoticed is an import or an argument parser after the library moves under them.
Property: every Python tool loads and its --help exits 0; each device run script prints
its usage with --help and refuses to start without an output directory.
"""

import json
import math
import re
import shutil
import subprocess

import pytest
from conftest import ROOT, load_script

PY_TOOLS = sorted(p.name for p in (ROOT / "tools").glob("*.py"))
SH_TOOLS = sorted(p.name for p in (ROOT / "tools").glob("*.sh"))
PARTS = {  # a word each script's --help must print
    "cuda_device_run.sh": "checks  gpu and sweep side by side",
    "families_run.sh": "bi-verify --model",
    "train_device_run.sh": "resume",
}


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


def test_device_run_names_an_unknown_part(tmp_path):
    """A mistyped part is named on stderr (with the usage), not skipped in silence."""
    script = ROOT / "tools" / "cuda_device_run.sh"
    run = subprocess.run(
        ["bash", str(script), str(tmp_path), "sweeep"], capture_output=True, text=True, cwd=ROOT
    )
    assert "unknown part sweeep" in run.stderr and "checks" in run.stderr


def test_make_models_writes_loadable_models_of_the_documented_layouts(tmp_path, capsys):
    import mlx.core as mx
    import mlx_lm

    from bi_rl.rollout.caches import layer_plan

    tool = load_script("tools/make_models.py")
    tool.main(["--list"])
    names = capsys.readouterr().out.split()
    assert {"qwen3_moe-q4", "mixtral-bf16", "gpt_oss-q4", "gemma2-bf16", "gemma3_text-q4"} <= set(
        names
    )
    tool.main([str(tmp_path), "gpt_oss-q4", "gemma2-bf16", "--small"])
    gpt, _ = mlx_lm.load(str(tmp_path / "gpt_oss-q4"))
    assert layer_plan(gpt).windows == (32, None), "a sliding layer, then a full one"
    assert "scales" in gpt.model.layers[0].mlp.experts.up_proj, "the experts are quantized"
    gemma, _ = mlx_lm.load(str(tmp_path / "gemma2-bf16"))
    assert layer_plan(gemma).grouped_mask, "grouped-query heads, as Gemma 2's own"
    for model in (gpt, gemma):
        assert mx.isfinite(model(mx.array([[1, 2, 3]]))).all().item()
    # Real widths, without building them: the published shapes.
    family, cfg = tool.config_for("qwen3_moe", 2, small=False)
    assert (cfg["hidden_size"], cfg["num_experts"], cfg["num_experts_per_tok"]) == (2048, 128, 8)
    assert (
        tool.config_for("gpt_oss", 4, small=False)[1]["layer_types"]
        == [
            "sliding_attention",
            "full_attention",
        ]
        * 2
    )


def test_engine_profile_times_every_layer_in_both_modes(tmp_path, capsys):
    """The tiny workload on the CPU: each layer of the step is timed in both modes (the
    H200 run would otherwise be the first to find a broken piece)."""
    tool = load_script("tools/engine_profile.py")
    out = tmp_path / "profile.json"
    argv = ["--workload", "tiny", "--model-dir", str(tmp_path / "m"), "--batch", "2"]
    assert tool.main([*argv, "--steps", "3", "--repeats", "1", "--json", str(out)]) == 0
    table = json.loads(out.read_text())["ms_per_step"]
    assert sorted(table) == ["off", "strict"]
    for row in table.values():
        # The layers up to "+read" time their steps directly; "engine" and "+log" are a
        # difference of two wall times (a rollout of steps + 1 tokens minus one of 1 token),
        # which three steps on a busy 2-core machine can leave at or below zero.
        assert all(row[layer] > 0 for layer in tool.LAYERS[:4])
        assert all(math.isfinite(row[layer]) for layer in tool.LAYERS[4:])
    pieces = json.loads(out.read_text())["ms_per_piece"]
    assert "sample" in pieces and all(ms > 0 for ms in pieces.values())
    assert "ms per decode step" in capsys.readouterr().out
    assert tool.main([*argv, "--steps", "0"]) == 2


def test_engine_profile_splits_the_host_phases_of_both_steps(tmp_path, capsys):
    """--phases-only: the bare step's and the engine's host phases, per mode, each a
    non-negative time, and they add up to no more than the step they split."""
    tool = load_script("tools/engine_profile.py")
    out = tmp_path / "profile.json"
    argv = ["--workload", "tiny", "--model-dir", str(tmp_path / "m"), "--batch", "2"]
    assert (
        tool.main([*argv, "--steps", "4", "--repeats", "1", "--phases-only", "--json", str(out)])
        == 0
    )
    doc = json.loads(out.read_text())
    assert doc["ms_per_step"] == {}
    phases = doc["phases"]
    assert sorted(phases) == ["off bare", "off engine", "strict bare", "strict engine"]
    for name, row in phases.items():
        assert sorted(row) == sorted(tool.PARTS)
        assert row["build"] > 0 and row["submit"] > 0, name
        # the engine reads its rows back; the bare step only feeds its token forward
        assert (row["read"] > 0) == name.endswith("engine"), name
    assert "host phases" in capsys.readouterr().out


def _nvcc_build(tmp_path, name: str, opt: str, link: tuple | list = ()) -> str:
    """Builds tools/<name>.cu for sm_90a with the build line its opening comment gives (the
    -gencode it names, at `opt`, then `link`), ptxas verbose; returns ptxas's report, every
    kernel in it without a stack frame or a spill."""
    src = ROOT / "tools" / f"{name}.cu"
    assert "-gencode arch=compute_90a,code=sm_90a" in src.read_text()
    out = tmp_path / name
    cmd = ["nvcc", "-std=c++17", "-gencode", "arch=compute_90a,code=sm_90a", opt]
    proc = subprocess.run(
        [*cmd, "-Xptxas", "-v", "-o", str(out), str(src), *link], capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert out.is_file()
    spills = [line for line in proc.stderr.splitlines() if "spill stores" in line]
    assert spills and all(
        x.strip().startswith("0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads")
        for x in spills
    )
    return proc.stderr


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
def test_mma_equiv_builds_for_hopper(tmp_path):
    """tools/mma_equiv.cu (run on an H100/H200 only) compiles for sm_90a with the build line
    its opening comment gives, both MMA families in it, without spills."""
    report = _nvcc_build(tmp_path, "mma_equiv", "-O2")
    assert "mma_sync_chain" in report and "wgmma_chain" in report


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
def test_attn_schedule_check_builds_for_hopper(tmp_path):
    """tools/attn_schedule_check.cu compiles for sm_90a with the build line its opening comment
    gives: the prefill attention in lockstep (one barrier), in ping-pong with cp.async and with
    TMA copies (named barriers: ptxas counts 16) and with one warpgroup, at head dims 64 and 128
    (twelve kernels), without spills."""
    report = _nvcc_build(tmp_path, "attn_schedule_check", "-O3")
    barriers = re.findall(r"used (\d+) barriers", report)
    assert len(barriers) == 12 and sorted(set(barriers)) == ["1", "16"], barriers
    assert barriers.count("16") == 6  # ping-pong, with and without TMA, at three kernels each


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
def test_tma_probe_builds_for_hopper(tmp_path):
    """tools/tma_probe.cu compiles for sm_90a with the build line its opening comment gives: a
    box load through each of the three maps (a kernel parameter, a host template with the
    address put in on the device, a map built on the device), the kernel that only builds the
    device map (its bytes are compared with the driver's) and the stream fed by TMA and by
    cp.async (six kernels), without spills; its command line refuses an unknown check before
    it touches the device."""
    report = _nvcc_build(tmp_path, "tma_probe", "-O3")
    kernels = re.findall(r"Compiling entry function '(\w+)'", report)
    assert sorted(kernels) == sorted(
        [f"_Z10probe_loadILi{m}EEv14CUtensorMap_stPKhPhPKtiixPt" for m in range(3)]
        + [f"_Z12probe_streamILb{t}EEv14CUtensorMap_stPKtxiiPj" for t in range(2)]
        + ["_Z9build_mapPKtiixPh"]
    ), kernels
    proc = subprocess.run([str(tmp_path / "tma_probe"), "bogus"], capture_output=True, text=True)
    assert proc.returncode == 2 and "unknown check bogus" in proc.stdout


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
def test_gemm_tma_check_builds_for_hopper(tmp_path):
    """tools/gemm_tma_check.cu compiles for sm_90a with the build line its opening comment
    gives: for 128 x 256 and 128 x 128 blocks, the GEMM fed by TMA (a copying warp: the
    multiplying threads' named barrier besides __syncthreads') and the cp.async one it is
    compared with (four kernels), without spills."""
    report = _nvcc_build(tmp_path, "gemm_tma_check", "-O3", link=["-ldl"])
    used = re.findall(
        r"Compiling entry function '_Z8(ref|tma)_gemmILi(\d+)E\w*'.*?used (\d+) barriers",
        report,
        re.S,
    )
    assert sorted(used) == [
        ("ref", "128", "1"),
        ("ref", "256", "1"),
        ("tma", "128", "2"),
        ("tma", "256", "2"),
    ], used


def test_hopper_ptx_compare_says_which_kernels_differ(tmp_path, capsys):
    """hopper_ptx.py compare: exit 0 only when every kernel's PTX is byte-identical; a kernel
    that differs or exists on one side only is named and makes it exit 1."""
    tool = load_script("tools/hopper_ptx.py")
    a, b = tmp_path / "a", tmp_path / "b"
    for d in (a, b):
        d.mkdir()
        (d / "k1.ptx").write_text(".version 8.0\nadd.s32 %r1, %r2, 1;\n")
    assert tool.main(["compare", str(a), str(b)]) == 0
    (b / "k1.ptx").write_text(".version 8.0\nadd.s32 %r1, %r2, 2;\n")
    (a / "k2.ptx").write_text("")
    assert tool.main(["compare", str(a), str(b)]) == 1
    out = capsys.readouterr().out
    assert "differs: k1.ptx" in out and "k2.ptx" in out and "0 identical, 1 differ" in out
    assert tool.main(["compare", str(a), str(tmp_path / "missing")]) == 2


def test_hopper_ptx_renders_a_kernel_where_nvrtc_is_installed():
    pytest.importorskip("cuda.bindings.nvrtc")
    tool = load_script("tools/hopper_ptx.py")
    label, *args = next(iter(tool.kernels()))
    ptx = tool._ptx(*args)
    assert ".target sm_90a" in ptx and ".entry" in ptx, label


SASS = """
        /*0000*/                   MOV R1, c[0x0][0x28] ;
        /*0010*/                   ISETP.GE.AND P0, PT, R2, 0x1, PT ;
        /*0020*/              @!P0 BRA 0x70 ;
        /*0030*/                   HMMA.16816.F32.BF16 R4, R8, R12, R4 ;
        /*0040*/                   IADD3 R2, R2, -0x1, RZ ;
        /*0050*/                   ISETP.NE.AND P0, PT, R2, RZ, PT ;
        /*0060*/               @P0 BRA 0x30 ;
        /*0070*/                   EXIT ;
"""


def test_hopper_sass_finds_loops_and_blocks_in_sass_text():
    """hopper_sass.py's reading of cuobjdump -sass text: opcodes without their predicate or
    modifiers, the backward branch at 0x60 as the loop 0x30..0x60 (a forward branch is none),
    the blocks split at branches and branch targets, and a histogram that names the MMAs."""
    tool = load_script("tools/hopper_sass.py")
    ins = tool.parse(SASS)
    assert [i.op for i in ins] == ["MOV", "ISETP", "BRA", "HMMA", "IADD3", "ISETP", "BRA", "EXIT"]
    assert tool.loops(ins) == [(0x30, 0x60, 4)]
    starts = [(start, len(part)) for start, part in tool.blocks(ins, 0x0, 0x70)]
    assert starts == [(0x0, 3), (0x30, 4), (0x70, 1)]
    # the MMA is named past the histogram's top opcodes
    assert tool.histogram(ins, top=1) == "ISETP 2 HMMA 1"


def test_hopper_sass_reports_a_kernel_where_the_tools_are_installed(capsys):
    """The few-row quantized kernel (bf16, 4-bit, two-warp blocks) compiled, disassembled and
    taken apart: its k-tile loop holds the four MMAs of a 64-wide k-tile."""
    pytest.importorskip("cuda.bindings.nvrtc")
    tool = load_script("tools/hopper_sass.py")
    try:
        tool.cuobjdump()
    except SystemExit:
        pytest.skip("no cuobjdump")
    match = ["bfloat16 QNarrowConfig(nt=1, warps=2, stages=12, bits=4"]
    assert tool.main(["--match", match[0], "--blocks"]) == 0
    out = capsys.readouterr().out
    assert "registers" in out and "loop" in out and "blocks of loop" in out
    assert "HMMA 4" in out
    assert tool.main(["--match", "no such kernel"]) == 2


NCU_HEAD = ["Address", "Source", "Warp Stall Sampling (All Samples)", "stall_wait", "stall_long_sb"]
NCU_ROWS = [  # set-up, a loop 0x20..0x50 around the MMA, an epilogue
    ["0x00", "S2R R1, SR_TID.X", "2", "0", "2"],
    ["0x10", "MOV R2, R1", "0", "0", "0"],
    ["0x20", "LDGSTS.E.BYPASS.128 [R2], desc[UR4][R4.64]", "3", "1", "2"],
    ["0x30", "HGMMA.64x256x16.F32.BF16 R24, gdesc[UR8], R24", "5", "5", "0"],
    ["0x40", "ISETP.GE.AND P0, PT, R3, R4, PT", "1", "1", "0"],
    ["0x50", "@!P0 BRA 0x20", "4", "0", "4"],
    ["0x60", "FMUL R24, R24, 1", "9", "9", "0"],
    ["0x70", "EXIT", "0", "0", "0"],
]


def test_ncu_stalls_reads_a_sass_table_by_reason_kind_region_and_opcode(tmp_path, capsys):
    """ncu_stalls.py on a made-up SASS table (a title line first, as ncu prints it, and
    gzipped): the loop is the one closed by the branch back over the HGMMA, predicates and
    type suffixes leave the opcodes, and every view adds up to the samples."""
    import csv
    import gzip

    tool = load_script("tools/ncu_stalls.py")
    path = tmp_path / "k-sass.csv.gz"
    with gzip.open(path, "wt", newline="") as f:
        w = csv.writer(f)
        w.writerow(["Kernel Name", "k"])
        w.writerows([NCU_HEAD, *NCU_ROWS])
    reasons, kinds, total, regions, ops = tool.read(path)
    assert total == 24 and reasons == {"wait": 16, "long_sb": 8}
    assert regions == {"before the loop": 2, "loop": 13, "after": 9}
    assert kinds["wgmma"] == 5 and kinds["async copy"] == 3 and kinds["branch"] == 4
    assert ops["FMUL"] == 9 and ops["BRA"] == 4 and ops["S2R"] == 2
    out = tmp_path / "s.json"
    assert tool.main([f"a={path}", f"b={path}", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "FMUL" in text and "37.5%" in text  # 9 of 24 samples
    assert json.loads(out.read_text())["b"]["regions"]["loop"] == 13
    with pytest.raises(SystemExit):
        tool.main([f"a={tmp_path / 'missing.csv'}"])


@pytest.mark.parametrize("label", ["bf16", "4-bit"])
def test_concat_ab_compares_the_concatenated_model_with_the_plain_one(tmp_path, label, monkeypatch):
    """tools/concat_ab.py's comparison: in strict mode the concatenated sets (two a layer,
    or one with an arm of one kind) give the plain model's logits bit for bit; the timing
    gives a median for the plain side and each arm; an unknown arm, and a run with
    BI_RL_CONCAT_PROJECTIONS set (its plain side would be concatenated too), are refused."""
    from bi_rl.bench import e2e
    from bi_rl.concat import CHOICES

    tool = load_script("tools/concat_ab.py")
    w = e2e.WORKLOADS["tiny"]
    layers = w.shape["num_hidden_layers"]
    prompts = e2e.make_prompts(3, w.prompt_lens, w.shape["vocab_size"], seed=3)
    for _, model, _ in e2e.each_model(w, None, str(tmp_path), models=(label,)):
        for arm, sets in (("1", 2 * layers), ("attention", layers), ("mlp", layers)):
            r = tool.compare(model, prompts, "strict", CHOICES[arm])
            assert r["sets"] == sets and r["differ"] == 0, (arm, r)
        arms = {a: CHOICES[a] for a in ("1", "mlp")}
        t = tool.time_batch(model, prompts, "off", arms, steps=2, repeats=2)
        assert set(t["median_ms"]) == {"plain", "1", "mlp"} and min(t["median_ms"].values()) > 0
    assert tool.main(["--workload", "tiny", "--sets", "1,qkv"]) == 2
    monkeypatch.setenv("BI_RL_CONCAT_PROJECTIONS", "1")
    assert tool.main(["--workload", "tiny"]) == 2


def test_off_step_parts_drops_the_mask_only_where_rows_are_padded(tmp_path):
    """tools/off_step_parts.py's arms differ in the attention mask alone: the first decode
    step's logits agree bit for bit at batch 1 (no row padded: the engine drops the mask
    itself) and differ where rows are padded (the padded rows then read their padding keys,
    the negative control); each arm's bare step splits into build, submit and wait; bad
    arguments are refused with status 2."""
    from bi_rl.bench import e2e

    tool = load_script("tools/off_step_parts.py")
    w = e2e.WORKLOADS["tiny"]
    for _, model, _ in e2e.each_model(w, None, str(tmp_path), models=("bf16",)):
        for b, same in ((1, True), (3, False)):
            prompts = e2e.make_prompts(b, w.prompt_lens, w.shape["vocab_size"], seed=b)
            masked = tool.first_logits(model, prompts)
            with tool.mask_dropped():
                dropped = tool.first_logits(model, prompts)
            assert (masked == dropped).all() == same, b
        t = tool.time_batch(model, prompts, steps=2, repeats=2)
        assert set(t) == set(tool.ARMS)
        for arm in t.values():
            assert arm["step"] > 0 and {"build", "submit", "wait", "spread"} <= set(arm)
    assert tool.main(["--workload", "tiny", "--batches", "0"]) == 2
    assert tool.main(["--workload", "tiny", "--models", "fp8"]) == 2


def test_score_parts_splits_the_scorers_time_and_counts_its_batches(tmp_path):
    """tools/score_parts.py: each score() call's wall time holds the host's building share
    (building and submitting, each positive: the layers are queued through the timed
    mx.async_eval) and its waits on the device (non-negative, together no more than the
    whole); the
    builder ran once a batch (3 at batch 1 over 3 items, 1 at batch 8), in both modes and in
    the block-shape arm; the plan tables are emptied between arms; bad arguments are refused
    with status 2."""
    from bi_rl.bench import e2e

    tool = load_script("tools/score_parts.py")
    w = e2e.WORKLOADS["tiny"]
    for _, model, _ in e2e.each_model(w, None, str(tmp_path), models=("bf16",)):
        items = tool.make_items(model, w, 3, 5, seed=1)
        assert len(items) == 3 and all(len(it.completion) == 5 for it in items)
        for batch, batches in ((1, 3), (8, 1)):
            for mode in tool.MODES:
                t = tool.timed_score(model, items, batch, mode)
                assert t["batches"] == batches, (batch, mode, t)
                assert t["build"] > 0 and t["submit"] > 0 and t["wait"] >= 0, t
                assert t["host"] == t["build"] + t["submit"], t
                assert t["host"] + t["wait"] <= t["total"], t
        row = tool.time_batch(model, items, 1, repeats=2)
        assert set(row) == set(tool.MODES) and row["strict"]["total"] > 0
        arms = (*tool.MODES, tool.FILL_ARM)
        row = tool.time_batch(model, items, 8, repeats=1, arms=arms)
        assert set(row) == set(arms) and row[tool.FILL_ARM]["total"] > 0
    from bi_rl.backends.cuda import hopper

    hopper._PLANS["probe"] = object()
    assert tool.forget_plans() >= 2 and "probe" not in hopper._PLANS
    assert tool.main(["--workload", "tiny", "--new", "-1"]) == 2
    assert tool.main(["--workload", "tiny", "--batches", "0"]) == 2


def _ncu_csv(path, launches):
    """An Nsight Compute --csv file: a log line, the header, one row a launch."""
    head = ["ID", "Kernel Name", "Metric Name", "Metric Unit", "Metric Value"]
    lines = ["==PROF== Connected to process 1", ",".join(f'"{h}"' for h in head)]
    for i, (name, ns) in enumerate(launches):
        row = [str(i), name, "gpu__time_duration.sum", "ns", f"{ns:,}"]
        lines.append(",".join(f'"{v}"' for v in row))
    path.write_text("\n".join(lines) + "\n")


def test_ncu_times_gives_each_case_its_own_launches(tmp_path, capsys):
    """The input-building kernels are set aside; each case's three calls are its run of
    launches, a call's time the sum of its kernels (cuBLAS's product and split-K reduction);
    the median of the three calls, beside the stock twin. A run that cannot be divided into
    the cases is refused."""
    tool = load_script("tools/ncu_times.py")
    setup = [("mlx::rbitsc(const unsigned int *)", 3000), ("void mlx::copy_v<float>(...)", 900)]
    ours = [("mlx::custom_kernel_bi_gemm(...)", ns) for ns in (12000, 10000, 11000)]
    stock = [("nvjet_tst(...)", 4000), ("void cublasLt::splitKreduce_kernel(...)", 1000)] * 3
    csv = tmp_path / "run.csv"
    _ncu_csv(csv, setup + ours + setup + setup + stock)
    out = tmp_path / "t.json"
    assert tool.main([str(csv), "gemm-m1", "stock-gemm-m1", "--json", str(out)]) == 0
    times = json.loads(out.read_text())
    assert times["gemm-m1"]["us"] == 11.0 and times["stock-gemm-m1"]["us"] == 5.0
    assert times["stock-gemm-m1"]["kernels"] == ["nvjet_tst", "void cublasLt::splitKreduce_kernel"]
    assert "2.20" in capsys.readouterr().out  # 11 / 5
    _ncu_csv(csv, setup + ours + setup + stock[:4])
    assert tool.main([str(csv), "gemm-m1", "stock-gemm-m1"]) == 1
    assert "stock-gemm-m1: 4 launches" in capsys.readouterr().err
    assert tool.main([str(csv), "gemm-m1"]) == 1  # two runs of launches for one case
