"""bi_rl.fusion: sibling projections grouped into one grouped_linear (grouped_quantized_matmul)
call change no bit.

Properties: a grouped model's logits inside the strict mode are bitwise those of the same
model ungrouped (qwen2, qwen3 and llama families, float32 and bfloat16, one row and several,
prefill and a cached decode step; 4- and 8-bit quantized qwen3 and llama), and a counting
backend proves the grouped path ran (one grouped call per group and forward, that many fewer
single ones); a member called with another activation, or after a weight (or a quantized
member's scales) changed, computes its own product; biased, LoRA, mixed plain and quantized,
mismatched or differently typed or quantized siblings are not grouped; the registry keeps no
module alive and drops pending outputs once taken; outside the mode grouped layers run stock MLX; a
rollout through the engine is sample for sample identical grouped and ungrouped.
"""

from __future__ import annotations

import gc
import threading

import mlx.core as mx
import mlx.nn as nn
import mlx_lm
import numpy as np
import pytest
from conftest import MARK, assert_same_bits, bits, counting_backend, marking_backend, rand
from mlx_lm.models.cache import make_prompt_cache
from mlx_lm.tuner.lora import LoRALinear
from test_engine import _assert_same, _prompts, _run
from tiny_models import build_model

import bi_rl
from bi_rl import _stock, backends, fusion, ops
from bi_rl.backends import Backend

# family -> groups in a two-layer model: qwen2's q/k/v carry biases, so only gate/up group
GROUPS = {"qwen2": 2, "qwen3": 4, "llama": 4}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("fusion-models")
    out = {}
    for i, arch in enumerate(GROUPS):
        for dtype in ("float32", "bfloat16"):
            path = build_model(root / f"{arch}-{dtype}", arch=arch, dtype=dtype, key=10 + i)
            out[arch, dtype] = mlx_lm.load(str(path))
    return out


@pytest.fixture(autouse=True)
def no_groups_left(monkeypatch):
    """Each test starts and ends with nothing registered (the registry is process-wide), and
    the engine groups rather than concatenates (bi_rl.concat replaces the sets it groups)."""
    monkeypatch.setenv("BI_RL_CONCAT_PROJECTIONS", "0")  # unset, on by default on Hopper
    fusion.MEMBERS.clear()
    yield
    fusion.MEMBERS.clear()
    fusion._local.pending.clear()


def forward(model, tokens):
    """Logits of a prefill over `tokens` and of one cached decode step after it, strict mode."""
    cache = make_prompt_cache(model)
    with bi_rl.batch_invariant_mode():
        prefill = model(tokens, cache=cache)
        step = model(tokens[:, -1:], cache=cache)
    mx.eval(prefill, step)
    return prefill, step


def _tokens(model, rows: int) -> mx.array:
    rng = np.random.default_rng(rows)
    return mx.array(rng.integers(4, model.args.vocab_size, size=(rows, 7)))


def _assert_grouped_forward_is_ungrouped(
    model, arch: str, label: str, single: str, grouped_op: str
):
    """A forward grouped has the ungrouped one's bits (prefill and a decode step, 1 and 5 rows),
    and a counting backend shows the grouped path ran: one `grouped_op` call per group and
    forward, that many fewer `single` calls, and the other grouped op never."""
    other = {"grouped_linear": "grouped_quantized_matmul"}.get(grouped_op, "grouped_linear")
    for rows in (1, 5):
        tokens = _tokens(model, rows)
        counted, calls = counting_backend()
        with backends.use(counted):
            plain = forward(model, tokens)
        singles = calls[single]
        assert fusion.group_projections(model) == GROUPS[arch]
        members = len(fusion.MEMBERS)
        calls.clear()
        with backends.use(counted):
            grouped = forward(model, tokens)
        fusion.ungroup_projections(model)
        for what, got, want in zip(("prefill", "decode step"), grouped, plain, strict=True):
            assert_same_bits(got, want, f"{label} {rows} rows, {what}")
        # guard: the grouped path ran, one call per group and forward (two forwards)
        assert calls[grouped_op] == 2 * GROUPS[arch]
        assert calls[single] == singles - 2 * members
        assert not calls[other], f"these groups take {grouped_op}"
        assert not fusion._local.pending, "every pending output was taken"


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("arch", GROUPS)
def test_grouped_forward_has_the_bits_of_the_ungrouped_one(models, arch, dtype):
    model, _ = models[arch, dtype]
    _assert_grouped_forward_is_ungrouped(model, arch, f"{arch} {dtype}", "linear", "grouped_linear")


@pytest.fixture(scope="module")
def quantized(tmp_path_factory):
    root = tmp_path_factory.mktemp("fusion-quantized")
    out = {}
    for i, arch in enumerate(("qwen3", "llama")):
        for nbits in (4, 8):
            path = build_model(
                root / f"{arch}-q{nbits}", arch=arch, dtype="bfloat16", key=30 + i, quantize=nbits
            )
            out[arch, nbits] = mlx_lm.load(str(path))
    return out


@pytest.mark.parametrize("nbits", [4, 8])
@pytest.mark.parametrize("arch", ["qwen3", "llama"])
def test_grouped_quantized_forward_has_the_bits_of_the_ungrouped_one(quantized, arch, nbits):
    model, _ = quantized[arch, nbits]
    assert type(model.layers[0].self_attn.q_proj) is nn.QuantizedLinear, "guard: quantized"
    label = f"{arch} {nbits}-bit"
    _assert_grouped_forward_is_ungrouped(
        model, arch, label, "quantized_matmul", "grouped_quantized_matmul"
    )


def _quantized_attention(dims, bits=4, group_size=32, **members):
    def q(n):
        return nn.QuantizedLinear.from_linear(nn.Linear(dims, n, bias=False), group_size, bits)

    m = _Attention(dims, **({"q": q(dims), "k": q(dims // 2), "v": q(dims // 2)} | members))
    mx.eval(m.parameters())
    return m


def test_a_quantized_member_with_other_scales_computes_its_own():
    attn = _quantized_attention(64)
    assert fusion.group_projections(attn) == 1
    x = rand((3, 64), key=8)

    def plain(m, x):
        return ops.quantized_matmul(x, m.weight, m.scales, m.biases, True, m.group_size, m.bits)

    with bi_rl.batch_invariant_mode():
        got = [m(x) for m in (attn.q_proj, attn.k_proj, attn.v_proj)]
        for m, y in zip((attn.q_proj, attn.k_proj, attn.v_proj), got, strict=True):
            assert_same_bits(y, plain(m, x), "grouped quantized member")
        attn.q_proj(x)
        attn.k_proj.scales = attn.k_proj.scales * 2  # updated while its output is pending
        assert_same_bits(attn.k_proj(x), plain(attn.k_proj, x), "k after a scales update")
        assert (bits(attn.k_proj(x)) != bits(got[1])).any(), "control: the new scales matter"
        attn.q_proj(x), attn.v_proj(x)  # take the siblings' outputs of that last call
    assert not fusion._local.pending, "pending outputs (and their activation) were dropped"


@pytest.mark.parametrize(
    "member",
    [
        {"bits": 8},
        {"group_size": 64},
        {"mode": "mxfp4"},
        {"bias": True},
    ],
    ids=str,
)
def test_quantized_siblings_that_differ_are_not_grouped(member):
    lin = nn.Linear(64, 32, bias=member.get("bias", False))
    if "mode" in member:
        v = nn.QuantizedLinear.from_linear(lin, 32, 4, mode=member["mode"])
    else:
        v = nn.QuantizedLinear.from_linear(lin, member.get("group_size", 32), member.get("bits", 4))
    attn = _quantized_attention(64, v=v)
    assert fusion.group_projections(attn) == 0
    assert fusion.group_projections(_quantized_attention(64)) == 1, "the control groups"


def test_a_member_with_another_activation_or_weight_computes_its_own():
    attn = _attention(64)
    assert fusion.group_projections(attn) == 1
    x1, x2 = rand((3, 64), key=5), rand((3, 64), key=6)

    def plain(m, x):
        return ops.linear(x, m.weight)

    with bi_rl.batch_invariant_mode():
        q1 = attn.q_proj(x1)  # the group runs on x1; k and v pending
        k2 = attn.k_proj(x2)  # another activation: the group runs again, on x2
        v1 = attn.v_proj(x1)  # x1's pending outputs were replaced: computed anew
        assert_same_bits(q1, plain(attn.q_proj, x1), "q on x1")
        assert_same_bits(k2, plain(attn.k_proj, x2), "k on x2")
        assert_same_bits(v1, plain(attn.v_proj, x1), "v on x1")

        attn.q_proj(x1)
        attn.k_proj.weight = rand((32, 64), key=7)  # updated while its output is pending
        assert_same_bits(attn.k_proj(x1), plain(attn.k_proj, x1), "k after a weight update")
        q_again = attn.q_proj(x1)  # called twice on one x: computed again, still its own bits
        assert_same_bits(q_again, plain(attn.q_proj, x1), "q called twice")
        attn.v_proj(x1), attn.k_proj(x1)

        attn.v_proj.bias = mx.zeros((32,))  # a sibling gained a bias: no grouped call
        assert_same_bits(attn.q_proj(x2), plain(attn.q_proj, x2), "q beside a biased v")
    assert not fusion._local.pending, "pending outputs (and their activation) were dropped"


class _Attention(nn.Module):
    def __init__(self, dims, q=None, k=None, v=None):
        super().__init__()
        self.q_proj = q or nn.Linear(dims, dims, bias=False)
        self.k_proj = k or nn.Linear(dims, dims // 2, bias=False)
        self.v_proj = v or nn.Linear(dims, dims // 2, bias=False)


def _attention(dims, **members):
    m = _Attention(dims, **members)
    mx.eval(m.parameters())
    return m


@pytest.mark.parametrize(
    "member",
    ["bias", "lora", "quantized", "input features", "dtype", "subclass"],
)
def test_siblings_that_are_not_plain_equal_linears_are_not_grouped(member):
    class Sub(nn.Linear):
        pass

    v = {
        "bias": nn.Linear(64, 32, bias=True),
        "lora": LoRALinear.from_base(nn.Linear(64, 32, bias=False), r=4),
        "quantized": nn.QuantizedLinear.from_linear(nn.Linear(64, 32, bias=False), 32, 4),
        "input features": nn.Linear(48, 32, bias=False),
        "dtype": nn.Linear(64, 32, bias=False),
        "subclass": Sub(64, 32, bias=False),
    }[member]
    if member == "dtype":
        v.set_dtype(mx.bfloat16)
    attn = _attention(64, v=v)
    assert fusion.group_projections(attn) == 0
    assert fusion.grouped(attn.q_proj) is None and not fusion.MEMBERS
    assert fusion.group_projections(_attention(64)) == 1, "the control groups"


def test_pending_outputs_are_per_thread(monkeypatch):
    """Two threads calling one group with their own activations each get their own bits,
    from one grouped call each (a pending state shared between them would need more)."""
    attn = _attention(64)
    fusion.group_projections(attn)
    members = (attn.q_proj, attn.k_proj, attn.v_proj)
    xs = [rand((2, 64), key=20 + t) for t in range(2)]
    # evaluated here: MLX streams are per thread, so each thread reads its bits itself
    want = {
        (t, i): bits(ops.linear(xs[t], m.weight)) for t in range(2) for i, m in enumerate(members)
    }
    got, ready = {}, threading.Barrier(2)
    real, launched = ops.grouped_linear, []
    monkeypatch.setattr(ops, "grouped_linear", lambda x, ws: launched.append(1) or real(x, ws))

    def worker(t):
        with bi_rl.batch_invariant_mode():
            q = members[0](xs[t])
            ready.wait(10)  # both threads hold a pending group before either takes from it
            k, v = members[1](xs[t]), members[2](xs[t])
            for i, out in enumerate((q, k, v)):
                got[t, i] = bits(out)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(2)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(20)
    assert got.keys() == want.keys(), "both threads finished"
    for key, b in want.items():
        assert (got[key] == b).all(), f"thread {key[0]} member {key[1]}"
    assert len(launched) == 2, "each thread took its siblings' outputs from its own call"


def test_registry_keeps_no_module_alive_and_regrouping_is_idempotent():
    attn = _attention(64)
    assert fusion.group_projections(attn) == 1
    assert fusion.group_projections(attn) == 1
    group = fusion.grouped(attn.k_proj)
    assert group == (attn.q_proj, attn.k_proj, attn.v_proj) and len(fusion.MEMBERS) == 3
    assert fusion.MEMBERS[id(attn.q_proj)][1] is fusion.MEMBERS[id(attn.v_proj)][1]
    del attn, group
    gc.collect()
    assert not fusion.MEMBERS, "a freed module's entry must go with it"


def test_outside_the_mode_grouped_layers_run_stock():
    attn = _attention(64)
    fusion.group_projections(attn)
    x = rand((4, 64), key=3)
    backend, calls = marking_backend()
    with backends.use(backend):
        outside = [m(x) for m in (attn.q_proj, attn.k_proj, attn.v_proj)]
        with bi_rl.batch_invariant_mode():
            inside = attn.q_proj(x)
    for out, m in zip(outside, (attn.q_proj, attn.k_proj, attn.v_proj), strict=True):
        assert_same_bits(out, _stock.linear_call(m, x), "stock nn.Linear outside the mode")
    assert calls["linear"] == 3, "inside the mode the marking backend computed the group"
    assert_same_bits(inside, _stock.linear(x, attn.q_proj.weight) + MARK, "marked result")


@pytest.mark.parametrize("name", [("llama", "float32"), ("qwen3", "bfloat16")])
def test_a_rollout_is_identical_grouped_and_ungrouped(models, monkeypatch, name):
    from bi_rl.rollout import engine

    monkeypatch.setattr(engine, "pays_off", lambda: False)  # groups only as the test says
    model, tok = models[name]
    prompts = _prompts(model.args.vocab_size)[:6]
    plain, _ = _run(model, tok, prompts, batch_size=4, prefill_chunk=4)
    real, launched = ops.grouped_linear, []

    def counted(x, ws):
        launched.append(len(ws))
        return real(x, ws)

    monkeypatch.setattr(ops, "grouped_linear", counted)
    assert fusion.group_projections(model) == GROUPS[name[0]]
    grouped, _ = _run(model, tok, prompts, batch_size=4, prefill_chunk=4)
    fusion.ungroup_projections(model)
    _assert_same(plain, grouped)
    assert launched and set(launched) == {2, 3}, "the engine's forwards ran the grouped path"


def test_grouping_removes_only_the_groups_it_added_also_on_error():
    mine, theirs = _attention(64), _attention(64)
    fusion.group_projections(theirs)
    before = dict(fusion.MEMBERS)
    with fusion.grouping(mine) as added:
        assert added == 1 and fusion.grouped(mine.v_proj) == (mine.q_proj, mine.k_proj, mine.v_proj)
    assert fusion.grouped(mine.q_proj) is None, "the block's own group is gone"
    assert before == fusion.MEMBERS, "a group registered before the block stays as it was"
    with pytest.raises(RuntimeError, match="body"), fusion.grouping(mine):
        raise RuntimeError("body")
    assert fusion.grouped(mine.q_proj) is None, "removed when the block raised too"
    with fusion.grouping(theirs) as added:
        assert added == 0, "already grouped: nothing added"
    assert before == fusion.MEMBERS, "and so nothing removed"
    with fusion.grouping(mine, enabled=False) as added:
        assert added == 0 and fusion.grouped(mine.q_proj) is None


def test_grouping_pays_off_only_where_one_launch_computes_a_group(monkeypatch):
    from bi_rl.backends.cuda import gemm

    with backends.use(backends.get("cpu")):
        assert not fusion.pays_off(), "the CPU backend runs the members one by one"
    monkeypatch.setattr(gemm, "groups_in_one_launch", lambda: True)
    with backends.use(Backend("cuda", {})):
        assert fusion.pays_off(), "the CUDA backend where a group is one launch"
        monkeypatch.setenv(fusion.GROUP_ENV, "0")
        assert not fusion.pays_off(), "BI_RL_GROUP_PROJECTIONS=0 turns it off"
        monkeypatch.delenv(fusion.GROUP_ENV)
        monkeypatch.setattr(gemm, "groups_in_one_launch", lambda: False)
        assert not fusion.pays_off(), "no Hopper kernel: the members would launch one by one"


@pytest.mark.parametrize("pays", [True, False])
def test_the_engine_groups_for_its_run_where_it_pays_off(models, monkeypatch, pays):
    from bi_rl.rollout import engine

    model, tok = models["qwen3", "bfloat16"]
    prompts = _prompts(model.args.vocab_size)[:4]
    plain, _ = _run(model, tok, prompts, batch_size=4, prefill_chunk=4)
    real, seen = ops.grouped_linear, []

    def counted(x, ws):
        seen.append(len(fusion.MEMBERS))
        return real(x, ws)

    monkeypatch.setattr(ops, "grouped_linear", counted)
    monkeypatch.setattr(engine, "pays_off", lambda: pays)
    run, _ = _run(model, tok, prompts, batch_size=4, prefill_chunk=4)
    _assert_same(plain, run)
    if pays:
        # two layers, each q/k/v (3 members), gate/up (2), and o_proj and down_proj as
        # groups of one (the head is the tied embedding): 14 registered during the run
        assert seen and set(seen) == {14}, "the engine's forwards ran the grouped path"
    else:
        assert not seen, "no grouping where it does not pay off (the negative control)"
    assert not fusion.MEMBERS, "the run removes the groups it added"


@pytest.mark.skipif(not fusion.pays_off(), reason="needs the CUDA backend on a Hopper GPU")
def test_the_engine_on_hopper_groups_in_one_launch_with_the_bits_of_separate_ones(
    models, monkeypatch
):
    """On Hopper a rollout groups by default: the grouped few-row launch ran (guard), and the
    samples are those of a run with BI_RL_GROUP_PROJECTIONS=0, which launched none."""
    from bi_rl.backends.cuda import hopper

    _assert_grouped_by_default(monkeypatch, *models["qwen3", "bfloat16"], hopper, "grouped_linear")


def _assert_grouped_by_default(monkeypatch, model, tok, module, launcher: str):
    """A rollout launched `module.launcher` (the grouped launch; it returns None where it does
    not apply) by default and never with BI_RL_GROUP_PROJECTIONS=0, and the two rollouts'
    samples are identical."""
    prompts = _prompts(model.args.vocab_size)[:6]
    real, launched = getattr(module, launcher), []

    def counted(*args):
        out = real(*args)
        launched.append(out is not None)
        return out

    monkeypatch.setattr(module, launcher, counted)
    monkeypatch.setenv(fusion.GROUP_ENV, "0")
    separate, _ = _run(model, tok, prompts, batch_size=4, prefill_chunk=4)
    assert not any(launched), "BI_RL_GROUP_PROJECTIONS=0: no grouped launch"
    monkeypatch.delenv(fusion.GROUP_ENV)
    grouped, _ = _run(model, tok, prompts, batch_size=4, prefill_chunk=4)
    assert any(launched), "by default the decode steps ran the grouped launch"
    _assert_same(separate, grouped)


def test_a_quantized_rollout_is_identical_grouped_and_ungrouped(quantized, monkeypatch):
    from bi_rl.rollout import engine

    monkeypatch.setattr(engine, "pays_off", lambda: False)  # groups only as the test says
    model, tok = quantized["qwen3", 4]
    prompts = _prompts(model.args.vocab_size)[:6]
    plain, _ = _run(model, tok, prompts, batch_size=4, prefill_chunk=4)
    real, launched = ops.grouped_quantized_matmul, []

    def counted(x, members, *args):
        launched.append(len(members))
        return real(x, members, *args)

    monkeypatch.setattr(ops, "grouped_quantized_matmul", counted)
    assert fusion.group_projections(model) == GROUPS["qwen3"]
    grouped, _ = _run(model, tok, prompts, batch_size=4, prefill_chunk=4)
    fusion.ungroup_projections(model)
    _assert_same(plain, grouped)
    assert launched and set(launched) == {2, 3}, "the engine's forwards ran the grouped path"


@pytest.mark.skipif(not fusion.pays_off(), reason="needs the CUDA backend on a Hopper GPU")
def test_a_quantized_rollout_on_hopper_groups_in_one_launch_with_the_bits_of_separate_ones(
    quantized, monkeypatch
):
    """On Hopper a 4-bit rollout groups by default: the grouped quantized launch ran (guard),
    and the samples are those of a run with BI_RL_GROUP_PROJECTIONS=0, which launched none."""
    from bi_rl.backends.cuda import hopper_qmm

    model, tok = quantized["qwen3", 4]
    _assert_grouped_by_default(monkeypatch, model, tok, hopper_qmm, "grouped_quantized_matmul")


def test_a_group_is_checked_again_when_a_member_gets_other_arrays(monkeypatch):
    """The sibling checks are skipped while the members hold the arrays last checked; a member
    given a weight of another input width is found out at the next call (the group then runs
    its members alone, each with its own product), and grouping resumes once it matches."""
    attn = _attention(64)
    fusion.group_projections(attn)
    real, launched = ops.grouped_linear, []
    monkeypatch.setattr(ops, "grouped_linear", lambda x, ws: launched.append(1) or real(x, ws))
    x = rand((2, 64), key=9)
    with bi_rl.batch_invariant_mode():
        [m(x) for m in (attn.q_proj, attn.k_proj, attn.v_proj)]
        assert len(launched) == 1
        attn.v_proj.weight = rand((32, 48), key=10)  # another input width: not groupable
        y = attn.q_proj(x)
        assert len(launched) == 1, "the group's checks ran again and refused it"
        assert_same_bits(y, ops.linear(x, attn.q_proj.weight), "q alone")
        assert attn.v_proj(rand((2, 48), key=11)).shape == (2, 32)
        attn.v_proj.weight = rand((32, 64), key=12)
        [m(x) for m in (attn.q_proj, attn.k_proj, attn.v_proj)]
        assert len(launched) == 2, "grouped again once the widths match"
    assert not fusion._local.pending


class _Siblings(nn.Module):
    """q/k/v projections of a 128-wide activation, bf16, plain or 4-bit."""

    def __init__(self, quantized: bool):
        super().__init__()
        for name, n in (("q_proj", 128), ("k_proj", 64), ("v_proj", 64)):
            if quantized:
                lin = nn.QuantizedLinear(128, n, bias=False, group_size=64, bits=4)
            else:
                lin = nn.Linear(128, n, bias=False)
            lin.set_dtype(mx.bfloat16)
            setattr(self, name, lin)


def _recording_hopper(monkeypatch) -> list:
    """The CUDA backend's Hopper paths on this machine, every kernel a stand-in that records
    its launch (spec and arguments) and returns zeros; fresh plan tables, so no plan holding a
    stand-in outlives the test."""
    from bi_rl.backends.cuda import gemm, hopper, hopper_qmm
    from bi_rl.backends.cuda import qmm as cuda_qmm
    from bi_rl.backends.cuda._kernels import Plans

    launches = []

    def kernel(spec):
        def launch(**kw):
            launches.append((spec, kw))
            shapes, dtypes = kw["output_shapes"], kw["output_dtypes"]
            return [mx.zeros(s, d) for s, d in zip(shapes, dtypes, strict=True)]

        return launch

    for mod in (hopper, hopper_qmm):
        monkeypatch.setattr(mod, "kernel", kernel)
        monkeypatch.setattr(mod, "prepare", lambda *a: True)
        monkeypatch.setattr(mod, "prepare_group", lambda *a: True)
    monkeypatch.setattr(hopper, "available", lambda: True)
    for mod, name in (
        (hopper, "_PLANS"), (hopper, "_GROUPS"), (hopper_qmm, "_PLANS"), (hopper_qmm, "_GROUPS"),
        (cuda_qmm, "_PLANS"), (cuda_qmm, "_CHECKED"), (gemm, "_PLANS"),
    ):  # fmt: skip
        monkeypatch.setattr(mod, name, Plans())
    return launches


def _counting_op(monkeypatch, name: str) -> list:
    """bi_rl.ops.<name> patched to append to the returned list on every call."""
    real, through_ops = getattr(ops, name), []

    def counted(*args):
        through_ops.append(1)
        return real(*args)

    monkeypatch.setattr(ops, name, counted)
    return through_ops


def _same_launch(a, b, x) -> bool:
    """Launch b is launch a on activation x: the same kernel, the same arrays after x (by
    identity) and the same grid, template and outputs."""
    (spec_a, kw_a), (spec_b, kw_b) = a, b
    ins_a, ins_b = kw_a["inputs"], kw_b["inputs"]
    rest = {k: v for k, v in kw_a.items() if k != "inputs"}
    return (
        spec_a == spec_b
        and ins_b[0] is x
        and len(ins_a) == len(ins_b)
        and all(p is q for p, q in zip(ins_a[1:], ins_b[1:], strict=True))
        and rest == {k: v for k, v in kw_b.items() if k != "inputs"}
    )


def _other_backends_go_through_the_op(call, xs, name: str, through_ops: list, launches: list):
    """Negative controls of the kept-launch tests, on the CUDA backend: another backend object
    with the same ops goes through the op (`name`) once, then keeps that call's launch; a
    backend whose op runs stock MLX (STOCK_OP) goes through the op on every call and keeps no
    launch. `call` runs the projection(s) on one activation."""
    from bi_rl.backends import cuda

    start = len(through_ops)
    with backends.use(Backend("cuda", dict(cuda.BACKEND.ops))):
        call(xs[0])
        call(xs[1])
    assert len(through_ops) == start + 1, "another backend object: through the op once, then kept"
    before = len(launches)
    with backends.use(Backend("cuda", {**cuda.BACKEND.ops, name: ops.STOCK_OP})):
        call(xs[0])
        call(xs[1])
    assert len(through_ops) == start + 3 and len(launches) == before, "stock: no launch kept"


@pytest.mark.skipif(
    mx.cuda.is_available(), reason="its stand-ins would replace the kernels this GPU process runs"
)
@pytest.mark.parametrize("quantized", [False, True], ids=["bf16", "4-bit"])
def test_a_group_reruns_the_launch_its_backend_made_for_the_same_call(monkeypatch, quantized):
    """On the CUDA backend (Hopper paths, stand-in kernels that record each launch) a group's
    first call goes through bi_rl.ops, and a later one with an activation of the same shape
    and the same member arrays runs the launch that call made: the same kernel on the same
    arguments (guard: the ops-level grouped op ran once). Another activation shape, a member
    given a new array, another backend object, and a backend whose grouped op runs stock MLX
    each go through bi_rl.ops again (the negative controls); one row past the grouped
    launch's limit no launch is kept (the members launch one by one)."""
    from bi_rl.backends import cuda
    from bi_rl.backends.cuda import hopper, hopper_qmm

    launches = _recording_hopper(monkeypatch)
    name = "grouped_quantized_matmul" if quantized else "grouped_linear"
    through_ops = _counting_op(monkeypatch, name)
    attn = _Siblings(quantized)
    mx.eval(attn.parameters())
    fusion.group_projections(attn)

    def qkv(x):
        return [m(x) for m in (attn.q_proj, attn.k_proj, attn.v_proj)]

    xs = [rand((1, 1, 128), mx.bfloat16, key=k) for k in range(3)]
    with backends.use(cuda.BACKEND), bi_rl.batch_invariant_mode():
        outs = qkv(xs[0])
        assert len(through_ops) == 1 and len(launches) == 1, "one grouped launch"
        assert [o.shape for o in outs] == [(1, 1, 128), (1, 1, 64), (1, 1, 64)]
        for i, x in enumerate(xs[1:], 2):
            qkv(x)
            assert len(through_ops) == 1, "later calls run the kept launch directly"
            assert len(launches) == i and _same_launch(launches[0], launches[-1], x)
        qkv(rand((1, 2, 128), mx.bfloat16, key=5))  # another activation shape
        assert len(through_ops) == 2
        old = attn.v_proj.weight
        attn.v_proj.weight = old + 0 if quantized else rand(old.shape, mx.bfloat16, key=6)
        qkv(xs[0])  # a member's new array: checked again, through the op
        assert len(through_ops) == 3
        _other_backends_go_through_the_op(qkv, xs, name, through_ops, launches)
        # the grouped launch's row limit, both sides: at the limit one launch, kept; one row
        # past it the members launch one by one, every call through the op
        limit = hopper_qmm.GROUP_ROWS if quantized else hopper.NARROW_ROWS
        for rows, grouped in ((limit, True), (limit + 1, False)):
            x = rand((1, rows, 128), mx.bfloat16, key=rows)
            before, through = len(launches), len(through_ops)
            qkv(x)
            qkv(x + 0)
            assert len(launches) - before == (2 if grouped else 6), rows
            assert len(through_ops) - through == (1 if grouped else 2), rows
    assert not fusion._local.pending


def _projection(quantized: bool, k: int = 128, n: int = 128):
    """A bf16 projection without bias, plain or 4-bit."""
    if quantized:
        lin = nn.QuantizedLinear(k, n, bias=False, group_size=64, bits=4)
    else:
        lin = nn.Linear(k, n, bias=False)
    lin.set_dtype(mx.bfloat16)
    return lin


@pytest.mark.skipif(
    mx.cuda.is_available(), reason="its stand-ins would replace the kernels this GPU process runs"
)
@pytest.mark.parametrize("quantized", [False, True], ids=["bf16", "4-bit"])
def test_a_single_projection_reruns_the_launch_its_own_op_made(monkeypatch, quantized):
    """`grouping` registers a plain projection in no sibling set (o_proj) as a group of one.
    On the CUDA backend (Hopper paths, stand-in kernels that record each launch) its first
    call goes through its own op (ops.linear or ops.quantized_matmul, never a grouped op), and
    a later one with an activation of the same shape runs the launch that call made: the same
    kernel on the same arguments (guard: the op ran once). Another activation shape, a new
    weight array, another backend object, a backend whose op runs stock MLX and a bias each
    go through the op again (the negative controls); on exit the group of one is removed."""
    from bi_rl.backends import cuda

    launches = _recording_hopper(monkeypatch)
    name = "quantized_matmul" if quantized else "linear"
    through_ops = _counting_op(monkeypatch, name)

    def refused(*args):
        raise AssertionError("a projection of one went through a grouped op")

    monkeypatch.setattr(ops, "grouped_linear", refused)
    monkeypatch.setattr(ops, "grouped_quantized_matmul", refused)
    block = _Siblings(quantized)
    block.o_proj = o = _projection(quantized)
    mx.eval(block.parameters())
    xs = [rand((1, 1, 128), mx.bfloat16, key=k) for k in range(3)]
    with backends.use(cuda.BACKEND), bi_rl.batch_invariant_mode(), fusion.grouping(block) as n:
        assert n == 2 and fusion.grouped(o) == (o,), "q/k/v a group, o_proj a group of one"
        assert o(xs[0]).shape == (1, 1, 128)
        assert len(through_ops) == 1 and len(launches) == 1, "its own op, one launch"
        for i, x in enumerate(xs[1:], 2):
            o(x)
            assert len(through_ops) == 1, "later calls run the kept launch directly"
            assert len(launches) == i and _same_launch(launches[0], launches[-1], x)
        o(rand((1, 2, 128), mx.bfloat16, key=5))  # another activation shape
        assert len(through_ops) == 2
        o.weight = o.weight + 0 if quantized else rand(o.weight.shape, mx.bfloat16, key=6)
        o(xs[0])  # a new weight array: through the op, whose launch reads it
        assert len(through_ops) == 3 and launches[-1][1]["inputs"][1] is o.weight
        _other_backends_go_through_the_op(o, xs, name, through_ops, launches)
        o(xs[0])
        o.bias = mx.zeros((128,), mx.bfloat16)
        o(xs[1])
        o(xs[2])
        assert len(through_ops) == 9, "a bias: the layer's own call, through the op each time"
    assert not fusion.MEMBERS, "the group of one is removed on exit"


def _decode(model, tokens, steps: int = 3) -> list:
    """Logits of a prefill over `tokens` and of `steps` cached decode steps after it (each
    feeding the last prompt token again), strict mode."""
    cache = make_prompt_cache(model)
    with bi_rl.batch_invariant_mode():
        outs = [model(tokens, cache=cache)]
        outs += [model(tokens[:, -1:], cache=cache) for _ in range(steps)]
    mx.eval(outs)
    return outs


def _keeping_backend():
    """The active backend with linear and quantized_matmul offering the launch of their call
    (`launch_for`) as the CUDA backend's do on Hopper: here a callable that runs the op's own
    implementation on the arguments its launch_for was given, each array replaced by the one
    passed to it, and counts its runs. The kept path then computes real values, so the bits
    show which arrays it read."""
    backend, kept = backends.active(), []

    def offering(fn, arrays: int):
        def impl(*args):
            return fn(*args)

        def launch_for(x, *args):
            rest = args[arrays:]

            def launch(x, *own):
                kept.append(1)
                return fn(x, *own, *rest)

            return launch

        impl.launch_for = launch_for
        return impl

    table = dict(backend.ops)
    table["linear"] = offering(table["linear"], 1)
    table["quantized_matmul"] = offering(table["quantized_matmul"], 3)
    return Backend(backend.name, table), kept


@pytest.mark.parametrize("which", ["bfloat16", "4-bit"])
def test_kept_single_launches_give_the_bits_of_the_plain_forward(models, quantized, which):
    """Where the backend's single ops offer their launch, a forward inside `grouping` (o_proj
    and down_proj groups of one) has every logit's bits of the plain forward, prefill and three
    decode steps, and the kept launches ran (guard: two decode steps of both layers' o_proj
    and down_proj). A layer given a new weight computes with it (control: the old weight's
    output differs), never with the arrays its kept launch was made for."""
    model, _ = models["qwen3", "bfloat16"] if which == "bfloat16" else quantized["qwen3", 4]
    tokens = _tokens(model, 2)
    plain = _decode(model, tokens)
    keeping, kept = _keeping_backend()
    with backends.use(keeping), fusion.grouping(model):
        got = _decode(model, tokens)
        assert len(kept) == 2 * 4, "the decode steps after the first ran the kept launches"
        o = model.layers[0].self_attn.o_proj
        k = o.weight.shape[1] * 32 // o.bits if which == "4-bit" else o.weight.shape[1]
        x = rand((2, 1, k), mx.bfloat16, key=3)  # a decode step's shape: o_proj's kept launch
        with bi_rl.batch_invariant_mode():
            before = o(x)
            assert len(kept) == 9, "guard: the kept launch"
            saved = dict(o.items())
            if which == "4-bit":
                o.scales = o.scales * 2
            else:
                o.weight = o.weight * 2
            after = o(x)
            assert len(kept) == 9, "new arrays: through the op"
            want = fusion._alone(o, x)
            o.update(saved)
        assert_same_bits(after, want, "the layer's own op on its new arrays")
        assert (bits(after) != bits(before)).any(), "control: the new arrays matter"
    for i, (g, p) in enumerate(zip(got, plain, strict=True)):
        assert_same_bits(g, p, f"{which} step {i}")
    assert not fusion.MEMBERS


@pytest.mark.parametrize("arch", ["qwen3", "gemma3_text", "gpt_oss", "mixtral"])
def test_the_module_walk_finds_what_named_modules_finds_once(arch, tmp_path):
    """fusion.modules(model) yields exactly the modules of named_modules(), each once, the
    model first (families with lists of layers and of experts); a module reachable twice (a
    shared child) is yielded once."""
    model, _ = mlx_lm.load(str(build_model(tmp_path / arch, arch)))
    walked = list(fusion.modules(model))
    named = [m for _, m in model.named_modules()]
    assert len({id(m) for m in walked}) == len(walked), "each module once"
    assert {id(m) for m in walked} == {id(m) for m in named}
    assert walked[0] is model
    shared = nn.Linear(4, 4)
    twice = nn.Sequential(shared, shared)
    assert [id(m) for m in fusion.modules(twice)] == [id(twice), id(shared)]
