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
  3. rescore   the scorer recomputes every logprob at the current weights in another batch
               composition (batch size one below the rollout's, a shuffled order, full
               forward passes): the trainer's view q. Logged: tokens whose bits differ and
               the k3 estimator of KL(p || q), exactly 0 in the mode;
  4. update    one Adam step on the clipped GRPO surrogate, token-mean per sample then mean
               over samples, no reference-model KL term (beta = 0). The policy logprobs are
               value-exact (bi_rl.score.policy): their value is the rescored invariant
               logprob, their gradient MLX's stock one, so the importance ratio
               exp(logp - logp_rollout) is exactly 1 at every token; logged as ratio
               min / mean / max and the count of ratios that are not exactly 1.

Every `--eval-every` steps the greedy accuracy on held-out problems is printed. With
`--mode off` the same loop runs on stock MLX with plain stock trainer logprobs: on a backend
whose kernels are batch-variant (MLX's CUDA backend) the KL and ratios then move off 0 and 1;
on the CPU backend stock MLX is itself invariant, so they stay exact there too (printed as a
finding). Exit status 1 when the mode is on and any token's bits differed.
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
import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np
from mlx.utils import tree_flatten

import bi_rl
from bi_rl.rollout.engine import Engine, EngineConfig
from bi_rl.rollout.prompts import Prompt
from bi_rl.rollout.sampler import SamplerConfig
from bi_rl.score.policy import make_batch, policy_logprobs
from bi_rl.score.report import compare
from bi_rl.score.scorer import Item, ScoreConfig, score, shuffled_order
from bi_rl.tasks.addition import EOS_ID, AdditionTask, decode, encode, partial_reward, reward

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
    eng = Engine(model, tokenizer, SamplerConfig(temperature=0.0, seed=0), ecfg)
    samples = [s for step in eng.generate(prompts) for s in step.ready]
    return float(
        np.mean(
            [
                reward(p.answer, decode(s.tokens)[0], s.finish)
                for p, s in zip(problems, samples, strict=True)
            ]
        )
    )


def rollout(engine: Engine, problems, step: int):
    prompts = [Prompt(f"step{step}-{i}", tuple(encode(p.prompt))) for i, p in enumerate(problems)]
    return [s for st in engine.generate(prompts) for s in st.ready]


def advantages(rewards: np.ndarray, n: int) -> np.ndarray:
    g = rewards.reshape(-1, n)
    return ((g - g.mean(axis=1, keepdims=True)) / (g.std(axis=1, keepdims=True) + 1e-4)).ravel()


def scatter(values: list[np.ndarray], samples, shape) -> mx.array:
    """Per-sample completion logprobs (float32) placed at their (B, L) positions."""
    out = np.zeros(shape, np.float32)
    for i, (v, s) in enumerate(zip(values, samples, strict=True)):
        p = len(s.prompt_tokens) - 1
        out[i, p : p + len(v)] = v
    return mx.array(out)


def update(model, opt, batch, old: mx.array, inv: mx.array, adv: np.ndarray, cfg: GRPOConfig):
    """One Adam step on the clipped GRPO surrogate: (loss, gradient norm, ratios at the tokens)."""
    a = mx.array(adv.astype(np.float32))[:, None]
    per_sample = batch.mask.sum(axis=1)
    seen = {}

    def loss_fn(m):
        lp = policy_logprobs(m, batch, cfg.temperature, invariant=inv, mode=cfg.mode)
        ratio = mx.exp(lp - old)
        seen["ratio"] = ratio
        surr = mx.minimum(ratio * a, mx.clip(ratio, 1 - cfg.clip, 1 + cfg.clip) * a)
        return -((surr * batch.mask).sum(axis=1) / per_sample).mean()

    loss, grads = nn.value_and_grad(model, loss_fn)(model)
    grad_norm = mx.sqrt(sum((g * g).sum() for _, g in tree_flatten(grads)))
    opt.update(model, grads)
    mx.eval(model.parameters(), opt.state, loss, grad_norm)
    return float(loss), float(grad_norm), np.array(seen["ratio"])[np.array(batch.mask) > 0]


def grpo_step(model, tokenizer, engine, opt, task, step: int, cfg: GRPOConfig) -> dict:
    """Rollout, reward, rescore, update: the metrics of one step."""
    t0 = time.perf_counter()
    problems = task.problems(cfg.seed, (step - 1) * cfg.prompts, cfg.prompts)
    samples = rollout(engine, problems, step)
    answers = [problems[s.prompt_index].answer for s in samples]
    texts = [decode(s.tokens)[0] for s in samples]
    triples = list(zip(answers, texts, samples, strict=True))
    rewards = np.array([partial_reward(a, t, s.finish) for a, t, s in triples])
    exact = float(np.mean([reward(a, t, s.finish) for a, t, s in triples]))

    items = [Item(s.prompt_tokens, tuple(s.tokens)) for s in samples]
    scfg = ScoreConfig(max(1, cfg.batch_size - 1), None, cfg.temperature, cfg.mode)
    scored = score(model, items, scfg, order=shuffled_order(len(items), step))
    rep = compare(
        [np.array(s.logprob_bits, np.uint32) for s in samples], [r.logprob_bits for r in scored]
    )

    batch = make_batch(items)
    old = scatter([s.logprobs for s in samples], samples, batch.inputs.shape)
    inv = scatter([r.logprobs for r in scored], samples, batch.inputs.shape)
    loss, grad_norm, ratios = update(model, opt, batch, old, inv, advantages(rewards, cfg.n), cfg)
    not_one = int((ratios.view(np.uint32) != np.float32(1.0).view(np.uint32)).sum())
    return {
        "step": step,
        "reward": float(rewards.mean()),
        "exact": exact,
        "tokens": rep.tokens,
        "differing": rep.differing,
        "k3_mean": rep.k3_mean,
        "k3_max": rep.k3_max,
        "ratio_min": float(ratios.min()),
        "ratio_mean": float(ratios.mean()),
        "ratio_max": float(ratios.max()),
        "ratio_not_1": not_one,
        "loss": loss,
        "grad_norm": grad_norm,
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
    ecfg = EngineConfig(
        n=cfg.n,
        max_tokens=cfg.max_tokens,
        stop_tokens=(EOS_ID,),
        batch_size=cfg.batch_size,
        mode=cfg.mode,
    )
    engine = Engine(
        model, tokenizer, SamplerConfig(temperature=cfg.temperature, seed=cfg.seed), ecfg
    )
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
            row = grpo_step(model, tokenizer, engine, opt, task, step, cfg)
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
