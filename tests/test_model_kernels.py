"""bi_rl.model.kernels: the Hopper GEMM kernels a model needs, listed and compiled ahead.

Properties: the plan holds exactly the configurations dispatch picks (hopper.choose_config,
hopper_qmm.choose_config, and the grouped launches' group_config) for every row count up to
the limit; a model's products are found (bias or not, tied embeddings, quantized layers,
sibling projections a rollout groups, none with grouping turned off); a first run says how
many kernels it compiles and counts them, a warm machine says nothing, and without a Hopper
GPU (this CPU) nothing happens at all.
"""

import mlx.core as mx
import mlx.nn as nn
import pytest

from bi_rl.backends.cuda import hopper, hopper_qmm, nvrtc
from bi_rl.model.kernels import gemm_needs, plan, prepare_kernels, sample_rows

NEEDS = {
    ("linear", mx.bfloat16, 151936, 2048, None),
    ("linear", mx.bfloat16, 6144, 2048, None),
    ("addmm", mx.float16, 64, 896, None),
    ("qmm", mx.bfloat16, 2048, 6144, 4),
    ("qmm", mx.bfloat16, 1024, 2048, 8),
}


@pytest.mark.parametrize("rows", [1, 64, 65, 129, 700, 3000])
def test_plan_is_what_dispatch_picks_at_every_row_count(rows):
    want = set()
    for kind, dt, n, k, bits in NEEDS:
        for m in range(1, rows + 1):
            if kind == "qmm":
                want.add((kind, dt, hopper_qmm.choose_config(m, n, k, bits), bits))
            else:
                want.add((kind, dt, hopper.choose_config(m, n, k), bits))
    got = plan(NEEDS, rows)
    assert set(got) == want and len(got) == len(want)
    assert len(sample_rows(rows)) < max(rows, 200), "far fewer row counts than the brute force"


class _Tiny(nn.Module):
    def __init__(self, tied: bool, bits: int | None):
        super().__init__()
        self.embed = nn.Embedding(300, 64)
        self.q = nn.Linear(64, 128, bias=True)
        self.o = nn.Linear(128, 64, bias=False)
        if not tied:
            self.lm_head = nn.Linear(64, 300, bias=False)
        self.set_dtype(mx.bfloat16)
        if bits:
            nn.quantize(self, group_size=32, bits=bits, class_predicate=lambda p, m: p == "o")


def test_gemm_needs_finds_every_product():
    bf = mx.bfloat16
    assert gemm_needs(_Tiny(tied=True, bits=None)) == {
        ("addmm", bf, 128, 64, None),
        ("linear", bf, 64, 128, None),
        ("linear", bf, 300, 64, None),  # the embedding, as the output layer
    }
    assert gemm_needs(_Tiny(tied=False, bits=4)) == {
        ("addmm", bf, 128, 64, None),
        ("qmm", bf, 64, 128, 4),
        ("linear", bf, 300, 64, None),  # lm_head; the embedding is only a lookup
    }
    f32 = _Tiny(tied=True, bits=None)
    f32.set_dtype(mx.float32)
    assert gemm_needs(f32) == set(), "float32 products never run the Hopper kernels"


def test_first_run_counts_its_compiles_and_a_warm_run_is_silent():
    model = _Tiny(tied=True, bits=None)
    jobs = plan(gemm_needs(model), 512)
    lines = []

    def compile_some(job):  # what hopper.prepare does on a cold machine: NVRTC runs
        if jobs.index(job) >= 2:  # the first two were cached
            nvrtc.on_compile(f"kernel {jobs.index(job)}")

    n = prepare_kernels(model, 512, say=lines.append, prepare=compile_some, available=True)
    assert n == len(jobs) - 2
    assert lines[0].startswith(f"bi_rl: compiling up to {len(jobs) - 2} CUDA kernels")
    assert "(first run on this machine" in lines[0]
    assert lines[1] == f"bi_rl:   [3/{len(jobs)}] kernel 2"
    assert lines[-1].startswith(f"bi_rl: compiled {n} CUDA kernels in ")
    assert nvrtc.on_compile is None, "the hook is restored"
    lines.clear()
    warm = prepare_kernels(model, 512, say=lines.append, prepare=lambda j: None, available=True)
    assert warm == 0 and lines == []
    again = prepare_kernels(model, 512, say=lines.append, prepare=compile_some, available=True)
    assert again == 0 and lines == [], "prepared once per process: nothing compiles again"


def test_nothing_happens_without_a_hopper_gpu():
    assert not hopper.available()  # this machine: no CUDA
    lines = []
    ran = []
    model = _Tiny(tied=True, bits=None)
    assert prepare_kernels(model, 512, say=lines.append, prepare=ran.append) == 0
    assert lines == [] and ran == []


class _Siblings(nn.Module):
    """An attention block's q/k/v and an MLP's gate/up, as bi_rl.fusion groups them."""

    def __init__(self, bits: int | None):
        super().__init__()
        self.self_attn = nn.Module()
        self.mlp = nn.Module()
        for name, n in (("q_proj", 128), ("k_proj", 64), ("v_proj", 64)):
            setattr(self.self_attn, name, nn.Linear(64, n, bias=False))
        for name in ("gate_proj", "up_proj"):
            setattr(self.mlp, name, nn.Linear(64, 192, bias=False))
        self.set_dtype(mx.bfloat16)
        if bits:
            nn.quantize(self, group_size=32, bits=bits)


def test_sibling_projections_are_needs_of_their_grouped_launches(monkeypatch):
    monkeypatch.setenv("BI_RL_CONCAT_PROJECTIONS", "0")  # grouped, not concatenated
    bf = mx.bfloat16
    assert {n for n in gemm_needs(_Siblings(None)) if "group" in n[0]} == {
        ("group", bf, (128, 64, 64), 64, None),
        ("group", bf, (192, 192), 64, None),
    }
    assert {n for n in gemm_needs(_Siblings(4)) if "group" in n[0]} == {
        ("qgroup", bf, (128, 64, 64), 64, 4),
        ("qgroup", bf, (192, 192), 64, 4),
    }
    monkeypatch.setenv("BI_RL_GROUP_PROJECTIONS", "0")
    assert not [n for n in gemm_needs(_Siblings(4)) if "group" in n[0]], "grouping turned off"


def test_concatenated_sets_are_needs_of_one_product_of_their_summed_width(monkeypatch):
    """Where a run in the mode concatenates sibling sets (bi_rl.concat.chosen_sets), a set is
    one "linear" / "qmm" of its members' summed width, not a group; the members' own
    products stay needs."""
    from bi_rl import concat

    bf = mx.bfloat16
    monkeypatch.setattr(concat, "faster_here", lambda: True)
    for bits, kind in ((None, "linear"), (4, "qmm")):
        needs = gemm_needs(_Siblings(bits))
        assert not [n for n in needs if "group" in n[0]], "concatenated sets are not grouped"
        assert {(kind, bf, 256, 64, bits), (kind, bf, 384, 64, bits)} <= needs
        assert (kind, bf, 128, 64, bits) in needs, "a member's own product"
    monkeypatch.setenv(concat.CONCAT_ENV, "mlp")  # q/k/v grouped, gate/up concatenated
    needs = gemm_needs(_Siblings(None))
    assert ("group", bf, (128, 64, 64), 64, None) in needs
    assert ("linear", bf, 384, 64, None) in needs
    monkeypatch.setenv(concat.CONCAT_ENV, "0")
    assert ("linear", bf, 384, 64, None) not in gemm_needs(_Siblings(None))


@pytest.mark.parametrize("rows", [1, 16, 64, 65, 512])
def test_plan_holds_the_grouped_launches_dispatch_picks(monkeypatch, rows):
    monkeypatch.delenv(hopper.NARROW_ENV, raising=False)
    widths = (2048, 1024, 1024)
    needs = {("group", mx.bfloat16, widths, 2048, None), ("qgroup", mx.bfloat16, widths, 2048, 4)}
    want = {(("group", 3), mx.bfloat16, hopper.group_config(widths), None)}
    for m in range(1, min(rows, hopper_qmm.GROUP_ROWS) + 1):
        want.add((("qgroup", 3), mx.bfloat16, hopper_qmm.group_config(m, widths, 4), 4))
    got = plan(needs, rows)
    assert set(got) == want and len(got) == len(want)


@pytest.mark.parametrize("m", [1, 16, 17, 64, 65, 4096])
def test_warm_up_compiles_the_entry_a_models_call_runs(monkeypatch, m):
    """A model's activations are (batch, positions, K): for a product without bias dispatch
    prepares the rank-free (nd) entry, and the warm-up must compile that one, with the same
    arguments, not the 2-D entry the model never launches (bf16 and 4-bit)."""
    from bi_rl.model import kernels

    k, n = 2048, 6144
    calls = {"dispatch": [], "warm-up": []}
    who = ["dispatch"]
    monkeypatch.setattr(hopper, "prepare", lambda *a: calls[who[0]].append(("gemm", a)) or True)
    monkeypatch.setattr(hopper_qmm, "prepare", lambda *a: calls[who[0]].append(("qmm", a)) or True)
    monkeypatch.setattr(hopper, "kernel", lambda spec: None)
    monkeypatch.setattr(hopper_qmm, "kernel", lambda spec: None)
    x = mx.zeros((1, m, k), mx.bfloat16)
    w = mx.zeros((n, k), mx.bfloat16)
    hopper._plan(x, w, False, None, 1.0, 1.0, None)
    wq, s, b = mx.quantize(w, group_size=64, bits=4)
    hopper_qmm._plan(x, wq, s, b, 64, 4, None)
    who[0] = "warm-up"
    for job in plan({("linear", mx.bfloat16, n, k, None), ("qmm", mx.bfloat16, n, k, 4)}, m):
        if job[2] in (hopper.choose_config(m, n, k), hopper_qmm.choose_config(m, n, k, 4)):
            kernels._prepare(job)
    assert sorted(calls["warm-up"], key=str) == sorted(calls["dispatch"], key=str)
    assert all(a[-1] is True for _, a in calls["warm-up"]), "the rank-free entries"
