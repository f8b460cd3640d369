"""End-to-end benchmarks: rollouts and rescoring, mode on and off, beside mlx-lm, same run.

Workloads (`WORKLOADS`): "qwen3-1.7b", a random-weight Qwen3 shaped like Qwen3-1.7B (28
layers, hidden 2048, intermediate 6144, 16 query / 8 KV heads of size 128, vocab 151936,
tied embeddings) in bfloat16 and its 4-bit (group 64) copy, prompts of 150-350 tokens, 256
new tokens, batch 1 / 8 / 64; "qwen2-0.5b", the earlier Qwen2-0.5B shape (64-token
prompts, 32 new tokens, batch 1 / 8 / 32 / 64); "tiny", the Qwen3 layout at a size a CPU
runs in seconds (`bi-bench --quick`). The model directories (config, safetensors, the
embedded adder's character tokenizer, a prompt file) are written once, offline, from
explicit random keys (`write_models`), and loaded as bi-rollout loads them.

For each model and batch size B, one wave of B prompts (lengths drawn from the workload's
range), stop tokens off, temperature 1:
  - rollout: the engine with its log written by the background writer, as bi-rollout
    runs it, in mode "strict" and "off", and mlx-lm's `batch_generate` (stock MLX, no log)
    as the peer; each once with max_tokens = new and once with 1. Decode tokens/s =
    B (new - 1) / (t_new - t_1), the engine's time per step (t_new - t_1) / (new - 1),
    prefill tokens/s = prompt tokens / (t_1 - one step). Beside these, each run's decode
    steps are timed one by one (the intervals between two consecutive engine steps, or
    mlx-lm `next_generated` calls, that only decoded): the median step of a run, one slow
    step or a pause of the host cannot move it, where the difference of two whole-run
    timings takes every such pause in;
  - bare step: the model alone decoding the same batch over the same context, its argmax
    fed back, step t + 1 queued before step t is read (mx.async_eval), per mode; the
    engine's overhead is its step over this one. Its wait share is the part of the step
    the host spends blocked on the device reading step t: near 0, the step is bound by
    the host (building and queuing the graph), and faster kernels would not shorten it.
    It is timed once more before the rollouts (`bare_step_first_ms_*`): the main figure
    comes after them, and a difference between the two says the process's state moved
    the step between the two (an engine over bare ratio then mixes two states);
  - rescoring: the generated sequences scored in full forward passes at batch B, per mode.
The sibling projections the engine and the scorer concatenate (bi_rl.concat) are built
before each timed rollout or rescoring, outside its clock, as its kernels are compiled before
it: bi-rollout and bi-rescore build them once a run, before the first batch, where the bench
times runs of one batch; `concat_ms_strict` / `concat_ms_off` is what that build took in each
mode (0 where nothing is concatenated: anywhere but on a Hopper GPU, and in mode off at batch
1; its rescoring concatenates nothing either).
The three rollouts alternate within each of `repeats` rounds (after a warm-up of each), so
drift hits all alike; medians are reported with the spread ((max - min) / median of the
noisiest). Start-up (`run_startup`, the bf16 model): the wall time of `bi-rollout --max-tokens 1`
on one prompt and of `bi-rescore` on its log, beside a bare `mlx_lm.load` and evaluation of
every parameter, each in a fresh process with the model files in the page cache.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, replace
from pathlib import Path

import mlx.core as mx

from bi_rl import backends
from bi_rl.concat import chosen_sets as concat_sets
from bi_rl.concat import concatenated
from bi_rl.fusion import grouping, pays_off
from bi_rl.mode import named_mode
from bi_rl.model import environment, load_model
from bi_rl.model.load import models_module
from bi_rl.ops import STOCK_OP
from bi_rl.rollout.batch import Batch, Prefill
from bi_rl.rollout.caches import layer_plan
from bi_rl.rollout.engine import Engine, EngineConfig
from bi_rl.rollout.log import LogWriter
from bi_rl.rollout.prompts import Prompt
from bi_rl.rollout.sampler import SamplerConfig
from bi_rl.rollout.schema import RunHeader, RunSettings
from bi_rl.score.scorer import Item, ScoreConfig, score

QWEN3_17B = dict(
    hidden_size=2048, num_hidden_layers=28, intermediate_size=6144, num_attention_heads=16,
    num_key_value_heads=8, head_dim=128, vocab_size=151936, tie_word_embeddings=True,
)  # fmt: skip
QWEN2_05B = dict(
    hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
    intermediate_size=4864, vocab_size=151936, tie_word_embeddings=True,
)  # fmt: skip
# Head dim 64: the smallest the CUDA attention kernels serve, so `bi-bench --quick` runs
# strict mode end to end on a GPU as on the CPU.
TINY = dict(
    hidden_size=64, num_hidden_layers=2, intermediate_size=128, num_attention_heads=2,
    num_key_value_heads=1, head_dim=64, vocab_size=1024, tie_word_embeddings=True,
)  # fmt: skip
MODES = ("strict", "off")
SIDES = (*MODES, "mlx_lm")


@dataclass(frozen=True)
class Workload:
    name: str
    model_type: str
    shape: dict
    batches: tuple[int, ...]
    prompt_lens: tuple[int, int]  # shortest, longest
    new_tokens: int


WORKLOADS = {
    w.name: w
    for w in (
        Workload("qwen3-1.7b", "qwen3", QWEN3_17B, (1, 8, 64), (150, 350), 256),
        Workload("qwen2-0.5b", "qwen2", QWEN2_05B, (1, 8, 32, 64), (64, 64), 32),
        Workload("tiny", "qwen3", TINY, (1, 8, 64), (12, 24), 24),
    )
}
MODELS = (("bf16", None), ("4-bit", 4))
MODELS_TEXT = ", ".join(label for label, _ in MODELS)


# -- the model directories ----------------------------------------------------------------------


def model_config(w: Workload) -> dict:
    """The mlx-lm configuration of the workload's model (its shape, and what the bench's
    random-weight models set besides)."""
    return {
        "model_type": w.model_type,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "max_position_embeddings": 40960,
        "eos_token_id": 2,  # the adder tokenizer's <eos>
        **w.shape,
    }


def write_models(w: Workload, root: Path, seed: int = 0, say=None) -> dict[str, Path]:
    """root/bf16, root/q4 (model directories) and root/prompts.jsonl, written if missing."""
    from mlx.utils import tree_flatten, tree_unflatten
    from mlx_lm.utils import save_config, save_model

    from bi_rl.assets import DEFAULT_MODEL

    root = Path(root)
    dirs = {label: root / ("q4" if bits else "bf16") for label, bits in MODELS}
    config = model_config(w)
    for label, bits in MODELS:
        path = dirs[label]
        if (path / "config.json").is_file():
            continue
        if say:
            say(f"writing the {w.name} model ({label}) to {path}")
        module = models_module(w.model_type)
        model = module.Model(module.ModelArgs.from_dict(config))
        params = []
        for i, (name, p) in enumerate(tree_flatten(model.parameters())):
            if "norm" in name:
                params.append((name, mx.ones(p.shape, dtype=mx.bfloat16)))
            else:
                r = mx.random.normal(p.shape, key=mx.random.key(seed * 1000 + i)) * 0.02
                params.append((name, r.astype(mx.bfloat16)))
        model.update(tree_unflatten(params))
        cfg = dict(config)
        if bits:
            import mlx.nn as nn

            nn.quantize(model, group_size=64, bits=bits)
            cfg["quantization"] = {"group_size": 64, "bits": bits}
        mx.eval(model.parameters())
        tmp = path.with_name(path.name + ".partial")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        save_model(tmp, model)
        save_config(cfg, tmp / "config.json")
        for name in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(DEFAULT_MODEL / name, tmp / name)
        tmp.rename(path)
        del model
        mx.clear_cache()
    prompts = root / "prompts.jsonl"
    if not prompts.is_file():
        lo, hi = w.prompt_lens
        digits = mx.random.randint(0, 10, (8, hi), key=mx.random.key(seed + 1)).tolist()
        rows = [
            {"id": f"p{i}", "prompt": "".join(map(str, d[: lo + i]))} for i, d in enumerate(digits)
        ]
        prompts.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return {**dirs, "prompts": prompts}


def make_prompts(b: int, lens: tuple[int, int], vocab: int, seed: int) -> list[Prompt]:
    """b prompts of random tokens, lengths drawn from [lens[0], lens[1]], keyed by `seed`."""
    k1, k2 = mx.random.split(mx.random.key(seed))
    sizes = mx.random.randint(lens[0], lens[1] + 1, (b,), key=k1).tolist()
    ids = mx.random.randint(3, vocab, (b, lens[1]), key=k2).tolist()
    return [Prompt(f"bench-{seed}-{i}", tuple(ids[i][:n])) for i, n in enumerate(sizes)]


# -- the three rollouts, the bare step, rescoring ------------------------------------------------


def _header(prompts, new: int) -> RunHeader:
    settings = RunSettings(
        model_digest="bench",
        tokenizer_digest="bench",
        sampler=SamplerConfig(),
        n=1,
        max_tokens=new,
        stop_tokens=(),
        stop_strings=(),
        prompt_count=len(prompts),
        prompts_digest="bench",
    )
    return RunHeader(settings, environment("bench", "strict"))


@contextmanager
def sets_built(model, mode: str, spent: list[float] | None = None, rows: int | None = None):
    """The sibling sets the engine (decode steps of up to `rows` rows) or, with rows None,
    the scorer concatenate in `mode` (bi_rl.concat's chosen_sets) built for the block; the
    engine's and the scorer's own blocks inside find them built and leave them. `spent` gets
    the seconds the build took (module doc)."""
    start = time.perf_counter()
    with concatenated(model, sets=concat_sets(mode != "off", rows)):
        if spent is not None:
            spent.append(time.perf_counter() - start)
        yield


def rollout(
    model, prompts, mode: str, new: int, log_dir: Path | None, built: list[float] | None = None
):
    """(seconds, samples, decode step seconds) of the engine with its log written, as
    bi-rollout runs it (log_dir None: the engine alone, no log); the step seconds are the
    intervals between consecutive engine steps that only decoded (`_decode_steps`). The sets
    the engine concatenates are built before the clock starts (`sets_built`; the seconds it
    took appended to `built`)."""
    cfg = EngineConfig(max_tokens=new, stop_tokens=(), batch_size=len(prompts), mode=mode)
    engine = Engine(model, None, SamplerConfig(temperature=1.0, seed=0), cfg)
    samples, marks = [], []
    path = None if log_dir is None else log_dir / f"bench-{mode}-{new}.jsonl"
    if path is not None:
        path.unlink(missing_ok=True)
    with sets_built(model, mode, built, rows=len(prompts)):
        start = time.perf_counter()  # the log writer's start-up is part of the run
        log = (
            nullcontext()
            if path is None
            else LogWriter(path, _header(prompts, new), background=True)
        )
        with log as writer:
            for step in engine.generate(prompts):
                if writer is not None:
                    writer.write(step.ready)
                samples += step.ready
                marks.append((time.perf_counter(), step.prefilled == 0 and step.generated > 0))
        return time.perf_counter() - start, samples, _decode_steps(marks)


def _decode_steps(marks: list[tuple[float, bool]]) -> list[float]:
    """Seconds between consecutive steps (time, decode only) where both only decoded: each a
    whole step of the pipelined loop, no prefill in it."""
    return [b[0] - a[0] for a, b in itertools.pairwise(marks) if a[1] and b[1]]


def mlx_lm_rollout(model, prompts, new: int) -> tuple[float, list[float]]:
    """(seconds, decode step seconds) of mlx-lm's batch_generate on the same prompts,
    temperature 1, stops off: its loop as batch_generate runs it (`BatchGenerator`, one
    `next_generated` call a step), each step timed; the step seconds are the intervals between
    consecutive calls that gave every row a token."""
    import importlib

    from mlx_lm.sample_utils import make_sampler

    # (the module, not the function of the same name that the package exports)
    generate = importlib.import_module("mlx_lm.generate")
    start = time.perf_counter()
    gen = generate.BatchGenerator(
        model,
        stop_tokens=[],
        sampler=make_sampler(temp=1.0),
        completion_batch_size=len(prompts),
        prefill_batch_size=len(prompts),
        prefill_step_size=512,
    )
    gen.insert([list(p.tokens) for p in prompts], [new] * len(prompts))
    marks = []
    with gen.stats():
        while responses := gen.next_generated():
            marks.append((time.perf_counter(), len(responses) == len(prompts)))
    gen.close()
    return time.perf_counter() - start, _decode_steps(marks)


class _Row:
    done = False


def prefilled(model, prompts, mode: str) -> Batch:
    """The prompts prefilled in one group (512-token chunks) as a decode batch, the engine's
    caches and padding, with no engine around it."""
    plan = layer_plan(model, "the bare-step benchmark")
    keyed = list(enumerate(p.tokens for p in prompts))
    group = Prefill.open([_Row() for _ in prompts], keyed, plan, 512)
    while not group.done:
        group.advance(model, mode)
    batch = Batch()
    batch.join(group)
    return batch


BARE_PHASES = ("build", "submit", "wait")


def bare_step(model, prompts, mode: str, steps: int, group: bool | None = None) -> dict[str, float]:
    """Seconds per decode step of the model alone on the prefilled batch, argmax fed back,
    step t + 1 queued before step t is read: `step` in all, and the host's share of it spent
    building the step's graph (`build`), queuing it with mx.async_eval (`submit`) and blocked
    on the device reading step t (`wait`). Sibling projections are grouped as the engine
    groups them (bi_rl.fusion.pays_off), unless `group` says otherwise (an A/B of grouping),
    and concatenated where the engine concatenates them (bi_rl.concat.chosen_sets), so the step
    is the one the engine runs."""
    if group is None:
        group = mode != "off" and pays_off()
    with sets_built(model, mode, rows=len(prompts)), grouping(model, group):
        return _bare_step(model, prompts, mode, steps)


def _bare_step(model, prompts, mode: str, steps: int) -> dict[str, float]:
    batch = prefilled(model, prompts, mode)
    y = batch.y
    spent = dict.fromkeys(BARE_PHASES, 0.0)
    with named_mode(mode):
        for i in range(steps + 2):
            if i == 2:  # two steps of warm-up
                y.tolist()
                start, spent = time.perf_counter(), dict.fromkeys(BARE_PHASES, 0.0)
            t0 = time.perf_counter()
            logits = model(y[:, None], cache=batch.caches)[:, -1, :]
            nxt = mx.argmax(logits, axis=-1).astype(mx.int32)
            t1 = time.perf_counter()
            mx.async_eval(nxt)
            t2 = time.perf_counter()
            y.tolist()
            spent["build"] += t1 - t0
            spent["submit"] += t2 - t1
            spent["wait"] += time.perf_counter() - t2
            y = nxt
        t = time.perf_counter()
        y.tolist()
        spent["wait"] += time.perf_counter() - t
    spent["step"] = time.perf_counter() - start
    return {k: v / steps for k, v in spent.items()}


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _median(xs: dict[str, list[float]]) -> tuple[dict[str, float], float]:
    med = {k: statistics.median(v) for k, v in xs.items()}
    spread = max((max(v) - min(v)) / statistics.median(v) for v in xs.values())
    return med, spread


def run_batch(w: Workload, label: str, model, b: int, repeats: int, log_dir: Path) -> dict:
    """One row: every measurement of `model` at batch size b (module doc)."""
    vocab, new = model.args.vocab_size, w.new_tokens
    prompts = make_prompts(b, w.prompt_lens, vocab, seed=b)
    prompt_tokens = sum(len(p.tokens) for p in prompts)

    built = {m: [] for m in MODES}  # seconds each build of the concatenated sets took

    def side(s: str, n: int) -> tuple[float, list[float]]:
        if s == "mlx_lm":
            return mlx_lm_rollout(model, prompts, n)
        seconds, _, steps = rollout(model, prompts, s, n, log_dir, built[s])
        return seconds, steps

    for s in SIDES:  # warm-up: kernels compiled, caches sized
        side(s, 2)
    first = {m: bare_step(model, prompts, m, new - 1)["step"] for m in MODES}
    t1 = {s: [] for s in SIDES}
    tn = {s: [] for s in SIDES}
    per_step = {s: [] for s in SIDES}  # per repeat, the median decode step
    for _ in range(repeats):
        for s in SIDES:  # alternate, so drift hits every side alike
            t1[s].append(side(s, 1)[0])
            seconds, steps = side(s, new)
            tn[s].append(seconds)
            per_step[s].append(statistics.median(steps) if steps else float("nan"))
    (t1m, s1), (tnm, sn) = _median(t1), _median(tn)
    (stepm, s_step) = _median(per_step)
    row = {
        "workload": w.name,
        "model": label,
        "batch": b,
        "prompt_tokens": prompt_tokens,
        "new_tokens": new,
    }
    for s in SIDES:
        step = (tnm[s] - t1m[s]) / (new - 1)
        row[f"decode_tok_s_{s}"] = b * (new - 1) / (tnm[s] - t1m[s])
        row[f"prefill_tok_s_{s}"] = prompt_tokens / max(t1m[s] - step, 1e-9)
        row[f"step_ms_{s}"] = 1e3 * step
        # the same from each run's median decode step: one slow step cannot move it
        row[f"median_step_ms_{s}"] = 1e3 * stepm[s]
        row[f"median_step_tok_s_{s}"] = b / stepm[s]
    row["median_step_spread"] = s_step
    _, samples, _ = rollout(model, prompts, "strict", new, log_dir)
    items = [Item(p.tokens, tuple(s.tokens)) for p, s in zip(prompts, samples, strict=True)]
    ts, bare, wait, build = ({m: [] for m in MODES} for _ in range(4))

    def scored(m: str) -> float:
        with sets_built(model, m, built[m]):
            return _timed(lambda: score(model, items, ScoreConfig(batch_size=b, mode=m)))

    for m in MODES:  # warm-up
        scored(m)
    for _ in range(repeats):
        for m in MODES:
            ts[m].append(scored(m))
            phases = bare_step(model, prompts, m, new - 1)
            bare[m].append(phases["step"])
            wait[m].append(phases["wait"] / phases["step"])
            build[m].append(phases["build"])
    (tsm, ss), (barem, sb), (waitm, _) = _median(ts), _median(bare), _median(wait)
    buildm, _ = _median(build)
    scored_tokens = prompt_tokens + b * new
    for m in MODES:
        row[f"rescore_tok_s_{m}"] = scored_tokens / tsm[m]
        row[f"bare_step_ms_{m}"] = 1e3 * barem[m]
        row[f"bare_step_first_ms_{m}"] = 1e3 * first[m]
        row[f"engine_vs_bare_{m}"] = row[f"step_ms_{m}"] / row[f"bare_step_ms_{m}"]
        row[f"bare_wait_share_{m}"] = waitm[m]
        row[f"bare_build_ms_{m}"] = 1e3 * buildm[m]  # the host building the step's graph
    row["off_vs_mlx_lm"] = row["decode_tok_s_off"] / row["decode_tok_s_mlx_lm"]
    row["strict_vs_mlx_lm"] = row["decode_tok_s_strict"] / row["decode_tok_s_mlx_lm"]
    row["strict_vs_off"] = row["decode_tok_s_strict"] / row["decode_tok_s_off"]
    for s in ("off", "strict"):
        row[f"median_step_{s}_vs_mlx_lm"] = stepm["mlx_lm"] / stepm[s]
    for m in MODES:
        row[f"concat_ms_{m}"] = 1e3 * statistics.median(built[m])
    row["spread"] = max(s1, sn, ss, sb)
    return row


# -- start-up -----------------------------------------------------------------------------------


def _wall(argv: list[str]) -> float:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    start = time.perf_counter()
    proc = subprocess.run(argv, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if proc.returncode not in (0, 1):
        raise RuntimeError(f"{' '.join(argv[:4])} failed: {proc.stderr.strip()[-300:]}")
    return seconds


def startup(model_dir: Path, prompts: Path, repeats: int, out: Path) -> dict:
    """Median wall seconds, fresh process each: bi-rollout of one token for one prompt, bi-rescore
    of its log, and a bare mlx_lm.load + eval of the parameters (the floor)."""
    py = sys.executable
    log = out / "startup.jsonl"
    rollout_cmd = [py, "-m", "bi_rl.cli.rollout", "--model", str(model_dir), "--prompts"]
    rollout_cmd += [str(prompts), "--limit", "1", "--max-tokens", "1", "--quiet"]
    rollout_cmd += ["--overwrite", "--out", str(log)]
    rescore_cmd = [py, "-m", "bi_rl.cli.rescore", str(log), "--batch-size", "1", "--json"]
    bare = "import sys, mlx_lm, mlx.core as mx; m, _ = mlx_lm.load(sys.argv[1]); "
    bare += "mx.eval(m.parameters())"
    bare_cmd = [py, "-c", bare, str(model_dir)]
    times = {"bi_rollout_s": [], "bi_rescore_s": [], "mlx_lm_load_s": []}
    _wall(rollout_cmd)  # warm: page cache, compiled kernels
    for _ in range(repeats):
        times["bi_rollout_s"].append(_wall(rollout_cmd))
        times["bi_rescore_s"].append(_wall(rescore_cmd))
        times["mlx_lm_load_s"].append(_wall(bare_cmd))
    med, spread = _median(times)
    med["bi_rollout_over_load_s"] = med["bi_rollout_s"] - med["mlx_lm_load_s"]
    return {**med, "spread": spread}


def check_models(models: tuple[str, ...]) -> None:
    """Refuse a label that is none of MODELS' (a ValueError naming the first)."""
    unknown = [m for m in models if m not in dict(MODELS)]
    if unknown:
        raise ValueError(f"unknown model {unknown[0]!r}; the workloads have {MODELS_TEXT}")


def each_model(
    w: Workload, model_dir: str | None, tmp: str, progress=None, models: tuple[str, ...] = ()
):
    """(label, model, scratch dir) for the workload's bf16 and 4-bit models in turn (or those
    of `models` alone: labels of MODELS), written to model_dir first if missing (default:
    under tmp); each is freed before the next loads."""
    check_models(models)
    paths = write_models(w, Path(model_dir or tmp) / ("" if model_dir else w.name), say=progress)
    for label, _ in MODELS:
        if models and label not in models:
            continue
        model, _ = load_model(paths[label])
        yield label, model, Path(tmp)
        del model
        mx.clear_cache()


def run(
    workload: str = "qwen3-1.7b",
    *,
    repeats: int = 3,
    model_dir: str | None = None,
    batches: tuple[int, ...] | None = None,
    models: tuple[str, ...] = (),
    progress=None,
    on_row=None,
) -> dict:
    """Every row of `workload` (module doc); model_dir: where its models are (or are written;
    default a temporary directory); models: the labels to run (default every one); on_row, if
    given, gets the result so far after each row (to save it as it comes)."""
    w = WORKLOADS[workload]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for label, model, scratch in each_model(w, model_dir, tmp, progress, models):
            for b in batches or w.batches:
                rows.append(run_batch(w, label, model, b, repeats, scratch))
                if progress:
                    progress(row_summary(rows[-1]))
                if on_row:
                    on_row({"workload": w.name, "rows": rows})
    return {"workload": w.name, "rows": rows}


def row_summary(r: dict) -> str:
    """One line with a row's ratios, for a log that must say what a run measured even when a
    time limit stops the run before its tables are printed."""
    rescore = r["rescore_tok_s_strict"] / r["rescore_tok_s_off"]
    return (
        f"{r['workload']} {r['model']} B={r['batch']}: off {r['off_vs_mlx_lm']:.2f}x mlx-lm, "
        f"strict {r['strict_vs_mlx_lm']:.2f}x (decode tok/s); strict/off: rollout "
        f"{r['strict_vs_off']:.2f}, rescore {rescore:.2f}"
        f"; step/bare: off {r['engine_vs_bare_off']:.2f}, strict {r['engine_vs_bare_strict']:.2f}"
        f"; spread {r['spread']:.2f}"
    )


# -- long-context rescoring ---------------------------------------------------------------------

ATTENTION_OPS = ("scaled_dot_product_attention",)
GEMM_OPS = (
    "linear",
    "grouped_linear",
    "matmul",
    "addmm",
    "quantized_matmul",
    "grouped_quantized_matmul",
    "gather_mm",
    "gather_qmm",
)


@contextmanager
def _only_invariant(ops: tuple[str, ...] | None):
    """Inside: the active backend with only `ops` invariant, every other op stock
    (`bi_rl.ops.STOCK_OP`); None leaves it whole. Splits strict mode's cost between op
    families."""
    if ops is None:
        yield
        return
    full = backends.active()
    part = replace(full, ops={k: (v if k in ops else STOCK_OP) for k, v in full.ops.items()})
    with backends.use(part):
        yield


# variant: the ops kept invariant in strict mode (None: all; off: stock MLX throughout)
LONG_VARIANTS = {
    "off": None,
    "strict": None,
    "gemm_only": GEMM_OPS,
    "attention_only": ATTENTION_OPS,
}


def long_rescore(
    model, *, batch: int = 4, length: int = 8192, completion: int = 64, repeats: int = 3
) -> dict:
    """Rescoring of `batch` sequences of `length` tokens (the last `completion` of them scored)
    in one full forward pass each batch: stock (off), strict, and strict with only the GEMMs
    or only attention invariant, which says how strict's cost splits between the two."""
    vocab = model.args.vocab_size
    completion = max(1, min(completion, length // 2))
    prompts = make_prompts(batch, (length - completion, length - completion), vocab, seed=7)
    toks = mx.random.randint(0, vocab, (batch, completion), key=mx.random.key(8)).tolist()
    items = [Item(p.tokens, tuple(t)) for p, t in zip(prompts, toks, strict=True)]

    def once(name: str) -> float:
        mode = "off" if name == "off" else "strict"
        with _only_invariant(LONG_VARIANTS[name]), sets_built(model, mode):
            return _timed(lambda: score(model, items, ScoreConfig(batch_size=batch, mode=mode)))

    for name in LONG_VARIANTS:  # warm-up
        once(name)
    times = {name: [] for name in LONG_VARIANTS}
    for _ in range(repeats):
        for name in LONG_VARIANTS:
            times[name].append(once(name))
    med, spread = _median(times)
    tokens = batch * length
    row = {"batch": batch, "length": length, "repeats": repeats, "spread": spread}
    for name in LONG_VARIANTS:
        row[f"seconds_{name}"] = med[name]
        row[f"tok_s_{name}"] = tokens / med[name]
    row["strict_vs_off"] = med["off"] / med["strict"]
    extra = med["strict"] - med["off"]
    row["strict_extra_s"] = extra
    row["gemm_extra_s"] = med["gemm_only"] - med["off"]
    row["attention_extra_s"] = med["attention_only"] - med["off"]
    return row


def run_long_rescore(
    workload: str = "qwen3-1.7b",
    *,
    repeats: int = 3,
    model_dir: str | None = None,
    batch: int = 4,
    length: int = 8192,
    models: tuple[str, ...] = (),
    progress=None,
    on_row=None,
) -> dict:
    """`long_rescore` on the workload's bf16 and 4-bit models (or those of `models`); on_row as
    in `run`."""
    w = WORKLOADS[workload]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for label, model, _ in each_model(w, model_dir, tmp, progress, models):
            row = {
                "model": label,
                **long_rescore(model, batch=batch, length=length, repeats=repeats),
            }
            rows.append(row)
            if progress:
                progress(
                    f"{w.name} {label} rescoring {batch} x {length}: strict "
                    f"{row['strict_vs_off']:.2f}x of off"
                )
            if on_row:
                on_row({"workload": w.name, "rows": rows})
    return {"workload": w.name, "rows": rows}


def run_startup(
    workload: str = "qwen3-1.7b", *, repeats: int = 3, model_dir: str | None = None, progress=None
) -> dict:
    """The start-up figures of the workload's bf16 model (module doc)."""
    w = WORKLOADS[workload]
    with tempfile.TemporaryDirectory() as tmp:
        paths = write_models(
            w, Path(model_dir or tmp) / ("" if model_dir else w.name), say=progress
        )
        return {"workload": w.name, **startup(paths["bf16"], paths["prompts"], repeats, Path(tmp))}
