"""Data-parallel rollouts on one and on several GPUs: the same log, and the throughput ratio.

    python tools/dist_bench.py OUTDIR                    # 2 H200s: the Qwen3-1.7B shape
    python tools/dist_bench.py OUTDIR --small --samples 16 --new-tokens 8 --batch 4 \\
        --backend ring                                   # a quick check on a CPU

Builds (once, under OUTDIR/model, with tools/make_qwen3.py) the random-weight bf16 model
shaped like Qwen3-1.7B (28 layers, hidden 2048, intermediate 6144, 16 query / 8 KV heads
of 128, vocab 151936) with the embedded adder's character tokenizer, and writes
OUTDIR/prompts.jsonl (digit strings of 150-350 tokens). Then, with the same settings:

  1. a short warm-up run on one device (compiles the CUDA kernels the workload needs);
  2. bi-rollout on one process: SAMPLES samples x NEW_TOKENS new tokens, batch BATCH;
  3. the same under mlx.launch on RANKS ranks, batch BATCH per rank (NCCL where MLX's
     NCCL backend runs, else the ring backend with one GPU per rank);
  4. bi-audit ONE MANY, which must say IDENTICAL;
  5. bi-rescore of the log on one process and on RANKS ranks: the reports must be equal.

It prints each step and the throughput ratio (decode tokens/s from each log's sidecar,
which times generation without start-up; wall-clock ratios too) and writes everything to
OUTDIR/dist_bench.json. Exit status 0 when the logs are identical and the reports equal.
NCCL_NVLS_ENABLE=0 is set for every rank unless already set (NVLink multicast stays off).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

sys.path.insert(0, str(Path(__file__).resolve().parent))  # tools/ is not a package
from make_qwen3 import SHAPE, SMALL, write_model  # noqa: E402  (the 1.7B-shaped model)


def write_prompts(path: Path, count: int, lo: int, hi: int, seed: int = 1) -> None:
    """`count` digit strings with lengths spread over [lo, hi] (the character tokenizer
    gives one token per digit, plus BOS)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    with open(path, "w") as f:
        for i in range(count):
            length = lo + (hi - lo) * i // max(count - 1, 1)
            digits = "".join(map(str, rng.integers(0, 10, size=length)))
            f.write(json.dumps({"id": f"p{i}", "prompt": digits}) + "\n")


def sh(cmd: list[str], env: dict, timeout: float, log: Path) -> tuple[int, float, str]:
    """Run cmd; (exit status, wall seconds, stdout+stderr), also written to `log`."""
    print("$", shlex.join(cmd), flush=True)
    t0 = time.perf_counter()
    try:
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
        rc, text = p.returncode, p.stdout + p.stderr
    except subprocess.TimeoutExpired as e:
        rc, text = 124, f"{e.stdout or ''}{e.stderr or ''}\ntimed out after {timeout} s"
    wall = time.perf_counter() - t0
    log.write_text(text)
    tail = "\n".join(text.strip().splitlines()[-4:])
    print(f"  -> rc {rc}, {wall:.1f} s\n  {tail}", flush=True)
    return rc, wall, text


def last_run(log: Path) -> dict:
    try:
        return json.loads(Path(str(log) + ".run.json").read_text())["runs"][-1]
    except (OSError, ValueError, KeyError, IndexError):
        return {}


def cli(name: str, *args) -> list[str]:
    return [sys.executable, "-m", f"bi_rl.cli.{name}", *map(str, args)]


def launch(backend: str, ranks: int, cmd: list[str], cuda: bool) -> list[str]:
    """mlx.launch on localhost. With the ring backend on GPUs each rank takes its own GPU
    (the NCCL launcher does that itself)."""
    launcher = [str(Path(sys.executable).with_name("mlx.launch")), "--backend", backend]
    launcher += ["-n", str(ranks), "--env", "NCCL_NVLS_ENABLE=0"]
    if backend == "ring" and cuda:
        inner = 'export CUDA_VISIBLE_DEVICES=$MLX_RANK; exec "$@"'
        return [*launcher, "--", "bash", "-c", inner, "rank", *cmd]
    return [*launcher, "--", *cmd]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path, help="output directory (model, prompts, logs, JSON)")
    ap.add_argument("--small", action="store_true", help="a tiny model shape (CPU check)")
    ap.add_argument("--samples", type=int, default=256, help="total samples (default 256)")
    ap.add_argument("--n", type=int, default=4, help="samples per prompt (default 4)")
    ap.add_argument("--new-tokens", type=int, default=256, help="tokens per sample (256)")
    ap.add_argument("--batch", type=int, default=64, help="batch size per rank (default 64)")
    ap.add_argument("--ranks", type=int, default=2, help="ranks of the parallel run (2)")
    ap.add_argument("--prompt-tokens", type=int, nargs=2, default=(150, 350), metavar=("LO", "HI"))
    ap.add_argument(
        "--backend",
        choices=("auto", "nccl", "ring"),
        default="auto",
        help="auto: NCCL on CUDA (ring if NCCL fails), ring elsewhere",
    )
    ap.add_argument("--mode", default="strict", help="bi-rollout --mode (default strict)")
    ap.add_argument("--timeout", type=float, default=420, help="seconds per command (420)")
    ap.add_argument("--no-rescore", action="store_true", help="skip step 5")
    args = ap.parse_args(argv)
    if args.samples % args.n:
        ap.error("--samples must be a multiple of --n")

    import mlx.core as mx

    cuda = mx.cuda.is_available()
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    env.setdefault("NCCL_NVLS_ENABLE", "0")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env.setdefault("TRANSFORMERS_VERBOSITY", "error")
    model, prompts = out / "model", out / "prompts.jsonl"
    if not (model / "config.json").exists():
        t0 = time.perf_counter()
        write_model(model, SMALL if args.small else SHAPE, seed=0)
        print(f"built {model} in {time.perf_counter() - t0:.1f} s", flush=True)
    write_prompts(prompts, args.samples // args.n, *args.prompt_tokens)
    common = ["--model", model, "--prompts", prompts, "--n", args.n, "--quiet"]
    common += ["--max-tokens", args.new_tokens, "--mode", args.mode, "--overwrite"]
    common += ["--no-chat-template", "--batch-size", args.batch]
    result: dict = {
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "device": str(mx.default_device()),
        "shape": "small" if args.small else "qwen3-1.7b",
        "workload": {
            k: getattr(args, k) for k in ("samples", "n", "new_tokens", "batch", "ranks", "mode")
        },
    }
    warm_prompts = max(1, min(args.samples // args.n, args.batch // args.n))
    warm = cli("rollout", *common, "--limit", warm_prompts, "--out", out / "warm.jsonl")
    warm[warm.index("--max-tokens") + 1] = "4"
    sh(warm, env, args.timeout, out / "warm.txt")

    one = out / "one.jsonl"
    rc, wall, _ = sh(cli("rollout", *common, "--out", one), env, args.timeout, out / "one.txt")
    result["one"] = {"rc": rc, "wall_s": round(wall, 2), "sidecar": last_run(one)}

    many = out / "many.jsonl"
    backends = (
        [args.backend] if args.backend != "auto" else (["nccl", "ring"] if cuda else ["ring"])
    )
    for backend in backends:
        cmd = launch(backend, args.ranks, cli("rollout", *common, "--out", many), cuda)
        rc, wall, _ = sh(cmd, env, args.timeout, out / f"many-{backend}.txt")
        run = last_run(many)
        ok = run.get("ranks") == args.ranks and run.get("records") == args.samples
        ok = ok and run.get("incomplete") is None
        result["many"] = {"backend": backend, "ok": ok, "wall_s": round(wall, 2), "sidecar": run}
        if ok:
            break
        print(f"the {backend} run did not complete (see many-{backend}.txt)", flush=True)

    rc, _, text = sh(cli("audit", one, many), env, args.timeout, out / "audit.txt")
    result["identical"] = rc == 0 and "IDENTICAL" in text
    tps1 = result["one"]["sidecar"].get("tokens_per_s") or 0
    tpsn = result["many"]["sidecar"].get("tokens_per_s") or 0
    result["ratio_tokens_per_s"] = round(tpsn / tps1, 3) if tps1 else None
    result["ratio_wall"] = round(result["one"]["wall_s"] / result["many"]["wall_s"], 3)

    if not args.no_rescore:
        r1, rn = out / "rescore-one.json", out / "rescore-many.json"
        _, w1, _ = sh(cli("rescore", one, "--report", r1), env, args.timeout, out / "r1.txt")
        backend = result["many"]["backend"]
        cmd = launch(backend, args.ranks, cli("rescore", one, "--report", rn), cuda)
        _, wn, _ = sh(cmd, env, args.timeout, out / "rn.txt")
        try:
            a, b = json.loads(r1.read_text()), json.loads(rn.read_text())
            equal = a["report"] == b["report"]
            ok = a["report"]["differing"] == 0
        except (OSError, ValueError, KeyError):
            equal = ok = False
        result["rescore"] = {"reports_equal": equal, "all_equal": ok, "wall_one_s": round(w1, 2)}
        result["rescore"]["wall_many_s"] = round(wn, 2)

    (out / "dist_bench.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: result[k] for k in result if k not in ("one", "many")}, indent=2))
    print(
        f"one: {tps1} tok/s, {args.ranks} ranks ({result['many']['backend']}): {tpsn} tok/s, "
        f"ratio {result['ratio_tokens_per_s']} (wall {result['ratio_wall']}); "
        f"logs {'IDENTICAL' if result['identical'] else 'DIFFER'}"
    )
    good = result["identical"] and (args.no_rescore or result["rescore"]["reports_equal"])
    return 0 if good else 1


if __name__ == "__main__":
    sys.exit(main())
