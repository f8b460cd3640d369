"""Where the rollout engine's step goes beyond the bare model step, one layer at a time.

    python tools/engine_profile.py [--workload qwen3-1.7b] [--model-dir DIR] [--batch 64]
                                   [--steps 128] [--repeats 3] [--json PATH]
                                   [--peer-first] [--gc-off]

bi-bench's end-to-end table reports the engine's decode step over the bare pipelined model
step (`step / bare`). This splits the difference. On one prefilled batch (the bench's
prompts and model), per mode (strict, off), each layer adds one piece of what the engine
does per step, all pipelined as the engine pipelines (step t + 1 queued before step t is
read):

  bare      the model, argmax fed back (bi-bench's bare step)
  +post     the engine's device work per step: keyed Gumbel sampling and the row fingerprint
            (`sampler.draw`, one fused pass on CUDA) and the float32 logprob of the drawn
            token, evaluated with the token
  +keys     + the per-row sampling keys hashed on the host and sent each step
  +read     + reading the tokens, logprob bits and fingerprints back and appending them to
            per-row Python lists (the engine's `_collect`)
  engine    the engine itself (Engine.generate), no log writer
  +log      the engine with its background log writer, as bi-rollout runs it

Milliseconds per step, medians of `repeats`; the difference between neighbouring columns is
what that piece costs. A second table times each per-step piece of `+post` alone on random
(batch, vocab) logits, synchronised after each call: what the device spends on it. A third
splits the host's time in the bare step and in the engine's step: building the step's graph
(`build`), queuing it on the device (`submit`, mx.async_eval), waiting for the step before it
(`wait`: the host has nothing to do until the device catches up), reading its outputs into
rows (`read`) and the rest (`other`: admission, compaction, the loop). A step whose `wait` is
near zero is bound by the host, not the device. Needs the model directory bi-bench writes
(`--model-dir`, written if missing). `--peer-first` runs mlx-lm's batch_generate once before
timing (bi-bench's end-to-end process runs it between the engine's runs), `--gc-off` turns
Python's garbage collector off: what the end-to-end rows' process does that this one does
not, one at a time.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import mlx.core as mx
import numpy as np

from bi_rl.bench import e2e
from bi_rl.logprobs import (
    fingerprint_ints,
    row_fingerprints,
    scaled_logits,
    scaled_token_logprobs,
    token_logprobs,
)
from bi_rl.mode import named_mode
from bi_rl.model import load_model
from bi_rl.rollout.engine import Engine, EngineConfig
from bi_rl.rollout.sampler import (
    SamplerConfig,
    draw,
    first_argmax,
    gumbel_noise,
    row_keys,
    sample,
    sequence_id,
)

LAYERS = ("bare", "+post", "+keys", "+read", "engine", "+log")
PARTS = ("build", "submit", "wait", "read", "other")


def layered_step(model, prompts, mode: str, layer: str, steps: int) -> float:
    """Seconds per step with the pieces up to `layer` (one of LAYERS[:4])."""
    batch = e2e.prefilled(model, prompts, mode)
    cfg = SamplerConfig(temperature=1.0, seed=0)
    ids = [sequence_id(p.id, 0) for p in prompts]
    fixed = row_keys(0, [(s, 0) for s in ids])
    lists = [([], [], []) for _ in prompts]
    y, pending = batch.y, None
    with named_mode(mode):
        for i in range(steps + 2):
            if i == 2:  # two steps of warm-up
                mx.eval(y)
                start = time.perf_counter()
            logits = model(y[:, None], cache=batch.caches)[:, -1, :]
            if layer == "bare":
                nxt = mx.argmax(logits, axis=-1).astype(mx.int32)
                outs = (nxt,)
            else:
                keys = row_keys(0, [(s, i) for s in ids]) if layer != "+post" else fixed
                x = scaled_logits(logits, cfg.temperature)  # as the engine's step shares it
                nxt, fps = draw(logits, x, keys, cfg)  # the engine's draw (fused on CUDA)
                outs = (nxt, scaled_token_logprobs(x, nxt), fps)
            mx.async_eval(*outs)
            if pending is not None:
                if layer == "+read":
                    tok, lp, fp = pending
                    lp_bits = np.array(lp).view(np.uint32).tolist()
                    for row, t, b, f in zip(
                        lists, tok.tolist(), lp_bits, fingerprint_ints(np.array(fp)), strict=True
                    ):
                        row[0].append(t)
                        row[1].append(b)
                        row[2].append(f)
                else:
                    pending[0].tolist()
            pending, y = outs, nxt
        pending[0].tolist()
    return (time.perf_counter() - start) / steps


def post_pieces(batch: int, vocab: int, repeats: int, calls: int = 20) -> dict[str, float]:
    """Milliseconds per call of each per-step piece on random (batch, vocab) bf16 logits,
    evaluated and synchronised after each call; medians of `repeats` runs of `calls`."""
    logits = (mx.random.normal((batch, vocab), key=mx.random.key(1)) * 4).astype(mx.bfloat16)
    keys = row_keys(0, [(i, 0) for i in range(batch)])
    tokens = mx.argmax(logits, axis=-1).astype(mx.int32)
    cfg = SamplerConfig(temperature=1.0, seed=0)
    pieces = {
        "argmax (bare)": lambda: mx.argmax(logits, axis=-1),
        "cast / T": lambda: logits.astype(mx.float32) / mx.array(1.0, mx.float32),
        "gumbel noise": lambda: gumbel_noise(keys, vocab),
        "first argmax": lambda: first_argmax(logits.astype(mx.float32)),
        "sample": lambda: sample(logits, keys, cfg),
        "token logprobs": lambda: token_logprobs(logits, tokens, 1.0),
        "fingerprints": lambda: row_fingerprints(logits),
        "draw (engine)": lambda: draw(logits, logits.astype(mx.float32), keys, cfg),
        "keys (host)": lambda: row_keys(0, [(i, 7) for i in range(batch)]),
    }
    mx.eval(logits, keys, tokens)
    out = {}
    for name, fn in pieces.items():
        mx.eval(fn())  # compiled, allocated
        runs = []
        for _ in range(repeats):
            start = time.perf_counter()
            for _ in range(calls):
                mx.eval(fn())
            runs.append((time.perf_counter() - start) / calls)
        out[name] = 1e3 * statistics.median(runs)
    return out


def engine_step(model, prompts, mode: str, steps: int, with_log: bool, log_dir: Path) -> float:
    """Seconds per step of the engine: (t(steps + 1 tokens) - t(1 token)) / steps."""

    def run(n: int) -> float:
        return e2e.rollout(model, prompts, mode, n, log_dir if with_log else None)[0]

    run(2)
    return (run(steps + 1) - run(1)) / steps


def bare_parts(model, prompts, mode: str, steps: int) -> dict[str, float]:
    """Seconds per step of the bare step's host phases (PARTS; no `read`: only the token),
    as bi-bench's bare step measures them (e2e.bare_step)."""
    phases = e2e.bare_step(model, prompts, mode, steps)
    parts = {k: phases.get(k, 0.0) for k in PARTS}
    parts["other"] = phases["step"] - sum(phases[k] for k in e2e.BARE_PHASES)
    return parts


class _TimedEngine(Engine):
    """The engine with its host phases timed (PARTS but `other`), one sample a launch or a
    collect, in order; the samples (tokens) are the engine's own."""

    parts: dict[str, list[float]]

    def _launch(self, batch):
        t0 = time.perf_counter()
        real_async_eval = mx.async_eval
        submitted = []

        def timed_async_eval(*arrays):
            t = time.perf_counter()
            real_async_eval(*arrays)
            submitted.append(time.perf_counter() - t)

        mx.async_eval = timed_async_eval
        try:
            launched = super()._launch(batch)
        finally:
            mx.async_eval = real_async_eval
        total = time.perf_counter() - t0
        self.parts["submit"].append(sum(submitted))
        self.parts["build"].append(total - sum(submitted))
        return launched

    def _collect(self, step, finished):
        t0 = time.perf_counter()
        mx.eval(step.tokens)
        t1 = time.perf_counter()
        added = super()._collect(step, finished)
        self.parts["wait"].append(t1 - t0)
        self.parts["read"].append(time.perf_counter() - t1)
        return added


def engine_parts(model, prompts, mode: str, steps: int) -> dict[str, float]:
    """Seconds per decode step of the engine's host phases (PARTS): build, submit, wait and
    read the medians of the decode steps' own samples (the first launch and collect, the
    prefill's, left out), so each is a time measured directly; `other` what is left of the
    step: (wall time over steps + 1 tokens - over 1 token) / steps less the four medians, a
    difference of wall times, which noise on a busy host can take below zero."""

    def run(n: int) -> tuple[dict[str, list[float]], float]:
        cfg = EngineConfig(max_tokens=n, stop_tokens=(), batch_size=len(prompts), mode=mode)
        engine = _TimedEngine(model, None, SamplerConfig(temperature=1.0, seed=0), cfg)
        engine.parts = {k: [] for k in PARTS if k != "other"}
        start = time.perf_counter()
        for _ in engine.generate(prompts):
            pass
        return engine.parts, time.perf_counter() - start

    run(2)
    (long, t_long), (_, t_short) = run(steps + 1), run(1)
    parts = {k: statistics.median(v[1:]) for k, v in long.items()}
    parts["other"] = (t_long - t_short) / steps - sum(parts.values())
    return parts


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workload", default="qwen3-1.7b", choices=sorted(e2e.WORKLOADS))
    p.add_argument("--model-dir", type=Path, default=None)
    p.add_argument("--model", default="bf16", choices=["bf16", "q4"])
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--steps", type=int, default=128)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--json", type=Path)
    p.add_argument(
        "--phases-only", action="store_true", help="only the host phases (the third table)"
    )
    p.add_argument(
        "--peer-first",
        action="store_true",
        help="run mlx-lm's batch_generate once on the same prompts before any timing, as "
        "bi-bench's end-to-end rows do between the engine's runs",
    )
    p.add_argument(
        "--gc-off", action="store_true", help="turn Python's cyclic garbage collector off"
    )
    args = p.parse_args(argv)
    if args.batch < 1 or args.steps < 1 or args.repeats < 1:
        print("engine_profile: --batch, --steps and --repeats must be >= 1", file=sys.stderr)
        return 2
    w = e2e.WORKLOADS[args.workload]
    root = args.model_dir or Path(tempfile.gettempdir()) / f"bi-rl-bench-{w.name}"
    dirs = e2e.write_models(w, root)
    model, _ = load_model(dirs["bf16" if args.model == "bf16" else "4-bit"])
    prompts = e2e.make_prompts(args.batch, w.prompt_lens, w.shape["vocab_size"], seed=args.batch)
    log_dir = Path(tempfile.mkdtemp(prefix="bi-rl-engine-profile-"))
    if args.gc_off:
        gc.disable()
    if args.peer_first:
        e2e.mlx_lm_rollout(model, prompts, args.steps)
    table: dict[str, dict[str, float]] = {}
    for mode in () if args.phases_only else ("strict", "off"):
        times: dict[str, list[float]] = {name: [] for name in LAYERS}
        for layer in LAYERS[:4]:  # warm-up: kernels compiled, allocator sized
            layered_step(model, prompts, mode, layer, 4)
        for _ in range(args.repeats):
            for layer in LAYERS[:4]:
                times[layer].append(layered_step(model, prompts, mode, layer, args.steps))
            times["engine"].append(engine_step(model, prompts, mode, args.steps, False, log_dir))
            times["+log"].append(engine_step(model, prompts, mode, args.steps, True, log_dir))
        table[mode] = {k: 1e3 * statistics.median(v) for k, v in times.items()}
        table[mode]["spread"] = max(
            (max(v) - min(v)) / statistics.median(v) for v in times.values()
        )
    how = "".join(
        f", {name}"
        for name, on in (("mlx-lm first", args.peer_first), ("gc off", args.gc_off))
        if on
    )
    print(f"ms per decode step, {w.name} {args.model}, batch {args.batch}, {args.steps} steps{how}")
    if table:
        print(f"{'mode':8}" + "".join(f"{k:>9}" for k in (*LAYERS, "spread")))
    for mode, row in table.items():
        print(f"{mode:8}" + "".join(f"{row[k]:9.3f}" for k in (*LAYERS, "spread")))
    phases: dict[str, dict[str, float]] = {}
    for mode in ("strict", "off"):
        bare_parts(model, prompts, mode, 4)  # warm-up (engine_parts warms up itself)
        for name, fn in (("bare", bare_parts), ("engine", engine_parts)):
            runs = [fn(model, prompts, mode, args.steps) for _ in range(args.repeats)]
            phases[f"{mode} {name}"] = {
                k: 1e3 * statistics.median(r[k] for r in runs) for k in PARTS
            }
    print("host phases, ms per decode step (wait near 0: bound by the host)")
    print(f"{'step':14}" + "".join(f"{k:>9}" for k in PARTS))
    for name, row in phases.items():
        print(f"{name:14}" + "".join(f"{row[k]:9.3f}" for k in PARTS))
    pieces = post_pieces(args.batch, w.shape["vocab_size"], args.repeats)
    print(f"ms per call alone, {args.batch} x {w.shape['vocab_size']} logits (bf16), synchronised")
    for name, ms in pieces.items():
        print(f"  {name:16} {ms:8.3f}")
    if args.json:
        meta = {"workload": w.name, "model": args.model, "batch": args.batch, "steps": args.steps}
        meta.update(peer_first=args.peer_first, gc_off=args.gc_off)
        doc = {"meta": meta, "ms_per_step": table, "ms_per_piece": pieces, "phases": phases}
        args.json.write_text(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
