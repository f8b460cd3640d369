"""GRPO on the embedded adder, on the CPU, on-policy to the bit.

    PYTHONPATH=. python examples/grpo.py                  # a few minutes on 2 CPU cores
    PYTHONPATH=. python examples/grpo.py --mode off       # stock MLX throughout, for contrast
    PYTHONPATH=. python examples/grpo.py --steps 3 --prompts 4 --n 4   # a smoke run
    python examples/grpo.py --device gpu --mode off    # the contrast on a variant backend

Every step:
  1. rollout   `--prompts` fresh addition problems (the task's train split) x `--n` samples,
               drawn by the keyed sampler in the continuous-batching engine, inside
               batch_invariant_mode; each token's float32 logprob is kept (the rollout
               policy p);
  2. reward    1 for the exact sum then <eos>, partial credit for well-formed numbers with
               right digits (bi_rl.tasks.addition.partial_reward); group-relative advantages
               A = (r - mean of the prompt's group) / (std of the group + 1e-4);
  3. check     bi_rl.train.grpo (the loop bi-train runs): the trainer recomputes every
               logprob at the current weights in full forward passes over the whole batch
               (not the rollout's token-by-token decode): the trainer's view q. Logged:
               tokens whose bits differ and the k3 estimator of KL(p || q), exactly 0 in the
               mode (in the mode a single differing bit stops the run);
  4. update    one Adam step on the clipped GRPO surrogate, token-mean per sample then mean
               over samples, no reference-model KL term (beta = 0). The policy logprobs are
               value-exact (bi_rl.score.policy): their value is the invariant logprob, their
               gradient MLX's stock one, so the importance ratio exp(logp - logp_rollout) is
               exactly 1 at every token; logged as ratio min / mean / max and the count of
               ratios that are not exactly 1.

All weights train here (the embedded model is tiny); `bi-train` runs the same loop with
LoRA adapters on any mlx-lm model, with checkpoints and resume.

Every `--eval-every` steps the greedy accuracy on held-out problems is printed. With
`--mode off` the same loop runs on stock MLX with plain stock trainer logprobs: on a backend
whose kernels are batch-variant (MLX's CUDA backend) the KL and ratios then move off 0 and 1;
on the CPU backend stock MLX is itself invariant, so they stay exact there too (printed as a
finding; the gate then reports instead of refusing). Exit status 1 when the mode is on and
any token's bits differed.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from contextlib import nullcontext
from dataclasses import asdict, dataclass
from pathlib import Path

import mlx.core as mx
import mlx.optimizers as optim
import numpy as np

import bi_rl
from bi_rl.rollout.engine import EngineConfig
from bi_rl.rollout.generate import generate_samples
from bi_rl.rollout.prompts import Prompt
from bi_rl.rollout.sampler import SamplerConfig
from bi_rl.tasks.addition import EOS_ID, AdditionTask, decode, encode, partial_reward, reward
from bi_rl.train.grpo import OffPolicyError, RolloutBatch, UpdateConfig, train_on_batch

EVAL_SEED = 7_000_003


@dataclass(frozen=True)
class GRPOConfig:
    steps: int = 50
    prompts: int = 32  # problems per step
    n: int = 8  # samples per problem (the GRPO group)
    lr: float = 1e-4
    clip: float = 0.2
    temperature: float = 1.0
    max_tokens: int = 6
    batch_size: int = 32  # rollout decode batch
    seed: int = 0
    eval_every: int = 10
    eval_size: int = 256
    mode: str = "strict"  # strict: invariant rollout, rescoring, trainer values; off: stock


def setup_arg_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", help="mlx-lm model directory (default: the embedded adder)")
    p.add_argument("--log", type=Path, help="also write per-step metrics as JSON lines here")
    p.add_argument(
        "--device",
        choices=("cpu", "gpu"),
        default="cpu",
        help="MLX device (default: cpu; gpu runs on the default GPU backend, e.g. CUDA)",
    )
    for name, default in asdict(GRPOConfig()).items():
        flag = "--" + name.replace("_", "-")
        if name == "mode":
            p.add_argument(flag, choices=("strict", "off"), default=default)
        else:
            p.add_argument(flag, type=type(default), default=default)
    return p


def greedy_accuracy(model, tokenizer, problems, cfg: GRPOConfig) -> float:
    prompts = [Prompt(f"eval-{i}", tuple(encode(p.prompt))) for i, p in enumerate(problems)]
    ecfg = EngineConfig(
        max_tokens=cfg.max_tokens, stop_tokens=(EOS_ID,), batch_size=64, mode=cfg.mode
    )
    samples, _ = generate_samples(model, tokenizer, prompts, SamplerConfig(0.0, seed=0), ecfg)
    return float(
        np.mean(
            [
                reward(p.answer, decode(s.tokens)[0], s.finish)
                for p, s in zip(problems, samples, strict=True)
            ]
        )
    )


def grpo_step(model, tokenizer, opt, task, step: int, cfg: GRPOConfig) -> dict:
    """Rollout, reward, then the gated update of bi_rl.train.grpo: the metrics of one step."""
    t0 = time.perf_counter()
    problems = task.problems(cfg.seed, (step - 1) * cfg.prompts, cfg.prompts)
    prompts = [Prompt(f"step{step}-{i}", tuple(encode(p.prompt))) for i, p in enumerate(problems)]
    ecfg = EngineConfig(
        n=cfg.n,
        max_tokens=cfg.max_tokens,
        stop_tokens=(EOS_ID,),
        batch_size=cfg.batch_size,
        mode=cfg.mode,
    )
    smp = SamplerConfig(temperature=cfg.temperature, seed=cfg.seed)
    samples, _ = generate_samples(model, tokenizer, prompts, smp, ecfg)
    answers = [problems[s.prompt_index].answer for s in samples]
    texts = [decode(s.tokens)[0] for s in samples]
    triples = list(zip(answers, texts, samples, strict=True))
    rewards = np.array([partial_reward(a, t, s.finish) for a, t, s in triples])
    exact = float(np.mean([reward(a, t, s.finish) for a, t, s in triples]))
    # Stock MLX (mode off) is the control: report its mismatch instead of refusing.
    ucfg = UpdateConfig(
        cfg.temperature, cfg.clip, mode=cfg.mode, allow_off_policy=cfg.mode == "off"
    )
    out = train_on_batch(model, opt, RolloutBatch.from_samples(samples, rewards), ucfg)
    check, (upd,) = out["check"], out["updates"]
    return {
        "step": step,
        "reward": float(rewards.mean()),
        "exact": exact,
        "tokens": check["tokens"],
        "differing": check["differing"],
        "k3_mean": check["k3_mean"],
        "k3_max": check["k3_max"],
        "ratio_min": upd["ratio_min"],
        "ratio_mean": upd["ratio_mean"],
        "ratio_max": upd["ratio_max"],
        "ratio_not_1": upd["ratio_not_1"],
        "loss": upd["loss"],
        "grad_norm": upd["grad_norm"],
        "seconds": time.perf_counter() - t0,
    }


def show(row: dict) -> str:
    acc = row.get("heldout_greedy_acc")
    return (
        f"step {row['step']:3d}  reward {row['reward']:.3f}  exact {row['exact']:.3f}  "
        f"k3 {row['k3_mean']:.3g} (max {row['k3_max']:.3g})  "
        f"differing {row['differing']}/{row['tokens']}  "
        f"ratio {row['ratio_min']:.6g}/{row['ratio_mean']:.6g}/{row['ratio_max']:.6g} "
        f"(not 1: {row['ratio_not_1']})  grad norm {row['grad_norm']:.3g}  {row['seconds']:.1f} s"
        + (f"  held-out greedy acc {acc:.3f}" if acc is not None else "")
    )


def main(argv=None) -> int:
    import mlx_lm

    args = setup_arg_parser().parse_args(argv)
    cfg = GRPOConfig(**{k: getattr(args, k) for k in asdict(GRPOConfig())})
    mx.set_default_device(mx.cpu if args.device == "cpu" else mx.gpu)
    if args.model is None:
        from bi_rl.assets import DEFAULT_MODEL

        args.model = DEFAULT_MODEL
    model, tokenizer = mlx_lm.load(str(args.model))
    task = AdditionTask(split="train")
    heldout = AdditionTask(split="heldout").problems(EVAL_SEED, 0, cfg.eval_size)
    opt = optim.Adam(learning_rate=cfg.lr)
    backend = bi_rl.active_backend().name
    print(
        f"GRPO: {cfg.prompts} problems x {cfg.n} samples per step, {cfg.steps} steps, mode "
        f"{cfg.mode}, backend {backend}, lr {cfg.lr}, temperature {cfg.temperature}"
    )
    acc0 = greedy_accuracy(model, tokenizer, heldout, cfg)
    print(f"step   0  held-out greedy acc {acc0:.3f}", flush=True)
    history = []
    t_start = time.perf_counter()
    with open(args.log, "w") if args.log else nullcontext() as log:
        for step in range(1, cfg.steps + 1):
            try:
                row = grpo_step(model, tokenizer, opt, task, step, cfg)
            except OffPolicyError as e:
                print(f"step {step:3d}  stopped: {e}", flush=True)
                return 1
            if step % cfg.eval_every == 0 or step == cfg.steps:
                row["heldout_greedy_acc"] = greedy_accuracy(model, tokenizer, heldout, cfg)
            history.append(row)
            if log:
                log.write(json.dumps(row) + "\n")
                log.flush()
            print(show(row), flush=True)
    k = max(1, min(10, len(history) // 3))
    first = np.mean([r["reward"] for r in history[:k]])
    last = np.mean([r["reward"] for r in history[-k:]])
    print(
        f"reward: mean of the first {k} steps {first:.3f} -> last {k} steps {last:.3f}; "
        f"held-out greedy acc {acc0:.3f} -> {history[-1]['heldout_greedy_acc']:.3f}; "
        f"{time.perf_counter() - t_start:.0f} s"
    )
    tokens = sum(r["tokens"] for r in history)
    differing = sum(r["differing"] for r in history)
    k3_zero = all(r["k3_max"] == 0.0 for r in history)
    ratios_one = all(r["ratio_not_1"] == 0 for r in history)
    print(
        f"on-policy check: {differing} of {tokens} rollout tokens differ from the trainer's "
        f"rescoring; k3 exactly 0 on every step: {k3_zero}; every ratio exactly 1: "
        f"{ratios_one}"
    )
    if cfg.mode == "off" and differing == 0:
        print(
            f"finding: stock MLX on the {backend} backend was batch-invariant here too; run "
            "--mode off on a batch-variant backend (MLX's CUDA backend) to see the mismatch"
        )
    return 1 if cfg.mode == "strict" and (differing or not ratios_one) else 0


if __name__ == "__main__":
    sys.exit(main())
