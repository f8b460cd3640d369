"""Train the tiny Qwen2 adder that ships as bi-rl's embedded default model.

    PYTHONPATH=. nice python examples/train_tiny_adder.py --out /tmp/tiny-adder

A Qwen2-architecture model (mlx_lm.models.qwen2) learns the addition task of
bi_rl.tasks.addition on the CPU with MLX: next-token cross entropy on the answer digits and
the end-of-sequence token of "<bos>012+345=0357<eos>", prompt tokens masked out. It prints the
loss and the greedy accuracy on held-out problems as it trains, and writes to --out:
config.json, model.safetensors, tokenizer.json, tokenizer_config.json, prompts.jsonl
(held-out problems for rollouts) and train_report.json (configuration, versions, history,
final greedy and sampled accuracy).

Reproducible: the weights are initialised from mx.random keys split off --seed, batch k
holds problems k*B .. k*B+B-1 of the train stream of --seed, and MLX's CPU backend is
single threaded and deterministic, so the same command gives the same bits on the same
machine type. The aim is a model that solves many but not all held-out problems greedily,
so that GRPO has a reward to raise: training stops after --steps, or at the first
evaluation whose greedy accuracy reaches --stop-acc.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import sys
import time
from dataclasses import asdict, dataclass, fields, replace
from functools import partial
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import mlx_lm
import numpy as np
from mlx.utils import tree_flatten, tree_unflatten
from mlx_lm.models import qwen2
from mlx_lm.utils import save_config, save_model

from bi_rl.tasks.addition import (
    EOS_ID,
    PAD_ID,
    VOCAB,
    AdditionTask,
    Problem,
    decode,
    encode,
    hash_words,
    reward,
    save_tokenizer,
)

# Sequences are 14 tokens long, and the task is all about attending to the digit at a fixed
# distance. With RoPE's usual base 10000 only about 6 of the 32 frequency pairs of a 64-wide
# head turn more than 0.2 radians per position, enough to tell neighbours apart; base 100
# gives about 11. Measured: base 100 reached a lower loss after 300 steps than 10000 or 10.
ROPE_THETA = 100.0

# Seeds of the held-out problem streams: evaluation during training, and the shipped prompts.
EVAL_SEED = 1_000_003
PROMPTS_SEED = 2_000_003


@dataclass(frozen=True)
class TrainConfig:
    seed: int = 0
    min_digits: int = 1
    max_digits: int = 3
    hidden_size: int = 128
    num_hidden_layers: int = 2
    num_attention_heads: int = 2  # head_dim 64: a size every invariant attention kernel takes
    num_key_value_heads: int = 1  # grouped-query attention, as in Qwen2 checkpoints
    intermediate_size: int = 128
    steps: int = 2000
    batch_size: int = 64
    learning_rate: float = 1e-3
    warmup_steps: int = 100
    weight_decay: float = 0.01
    eval_every: int = 50
    eval_size: int = 512
    stop_acc: float = 0.6
    num_prompts: int = 64
    sampled_repeats: int = 8


def model_args(cfg: TrainConfig) -> qwen2.ModelArgs:
    return qwen2.ModelArgs(
        model_type="qwen2",
        hidden_size=cfg.hidden_size,
        num_hidden_layers=cfg.num_hidden_layers,
        intermediate_size=cfg.intermediate_size,
        num_attention_heads=cfg.num_attention_heads,
        num_key_value_heads=cfg.num_key_value_heads,
        rms_norm_eps=1e-6,
        vocab_size=len(VOCAB),
        max_position_embeddings=64,
        rope_theta=ROPE_THETA,
        tie_word_embeddings=True,
    )


def init_weights(model: nn.Module, key: mx.array) -> None:
    """Initialise every parameter from ``key`` alone (no global random state).

    Norm scales 1, biases 0, matrices normal with std 1/sqrt(fan_in), the projections back
    into the residual stream scaled down by a further sqrt(2 * layers). (The 0.02 of large
    models is a quarter to a sixth of that at these widths: attention logits start near zero
    and training sat on a loss plateau for hundreds of steps.)
    """
    params = tree_flatten(model.parameters())
    keys = mx.random.split(key, len(params))
    residual_scale = 1 / math.sqrt(2 * model.args.num_hidden_layers)
    new = []
    for (name, p), k in zip(params, keys, strict=True):
        if name.endswith("norm.weight"):
            v = mx.ones(p.shape, p.dtype)
        elif name.endswith(".bias"):
            v = mx.zeros(p.shape, p.dtype)
        else:
            std = 1 / math.sqrt(p.shape[-1])
            if name.endswith(("o_proj.weight", "down_proj.weight")):
                std *= residual_scale
            v = std * mx.random.normal(p.shape, dtype=p.dtype, key=k)
        new.append((name, v))
    model.update(tree_unflatten(new))


def row_length(max_digits: int) -> int:
    """Tokens fed per training row: <bos> a + b = sum, the longest case (<eos> is a target)."""
    return 1 + 2 * max_digits + 2 + (max_digits + 1)


def batch_arrays(problems: list[Problem], length: int):
    """Inputs, targets and loss mask for teacher forcing, right padded to ``length``.

    The mask is 1 exactly where the target is an answer digit or the closing <eos>.
    """
    tokens = np.full((len(problems), length + 1), PAD_ID, dtype=np.int32)
    mask = np.zeros((len(problems), length), dtype=np.float32)
    for i, p in enumerate(problems):
        prompt = encode(p.prompt)
        seq = prompt + encode(p.answer, bos=False) + [EOS_ID]
        tokens[i, : len(seq)] = seq
        mask[i, len(prompt) - 1 : len(seq) - 1] = 1.0
    return mx.array(tokens[:, :-1]), mx.array(tokens[:, 1:]), mx.array(mask)


def complete(model, problems: list[Problem], max_new: int, temp: float = 0.0, seed: int = 0):
    """(text, stopped) for each problem: greedy decoding, or sampling at ``temp`` (keyed by
    ``seed``, the prompt length and the position).

    Full forward passes without a cache, prompts of equal length batched together, so the
    greedy result is exactly the model's argmax continuation.
    """
    out: list[tuple[str, bool]] = [("", False)] * len(problems)
    by_len: dict[int, list[int]] = {}
    for i, p in enumerate(problems):
        by_len.setdefault(len(p.prompt), []).append(i)
    for n, idx in sorted(by_len.items()):
        toks = mx.array([encode(problems[i].prompt) for i in idx])
        for t in range(max_new):
            logits = model(toks)[:, -1, :].astype(mx.float32)
            if temp == 0.0:
                nxt = mx.argmax(logits, axis=-1)
            else:
                k = mx.random.key(hash_words(seed, n, t) >> 1)
                nxt = mx.random.categorical(logits / temp, key=k)
            toks = mx.concatenate([toks, nxt.astype(mx.int32)[:, None]], axis=1)
        gen = np.array(toks[:, n + 1 :])
        for row, i in enumerate(idx):
            out[i] = decode(gen[row].tolist())
    return out


def accuracy(model, problems, max_new, temp=0.0, seed=0) -> float:
    outs = complete(model, problems, max_new, temp=temp, seed=seed)
    return float(
        np.mean(
            [
                reward(p.answer, t, "stop" if s else "length")
                for p, (t, s) in zip(problems, outs, strict=True)
            ]
        )
    )


def train(cfg: TrainConfig):
    """Train from scratch; returns (model, history, steps run, wall seconds, CPU seconds).

    CPU seconds are what the process used, the fair measure on a shared machine."""
    task = AdditionTask(cfg.min_digits, cfg.max_digits, split="train")
    eval_set = AdditionTask(cfg.min_digits, cfg.max_digits, "heldout").problems(
        EVAL_SEED, 0, cfg.eval_size
    )
    max_new = cfg.max_digits + 2  # the longest answer and its <eos>
    length = row_length(cfg.max_digits)

    model = qwen2.Model(model_args(cfg))
    init_weights(model, mx.random.key(cfg.seed))
    mx.eval(model.parameters())
    n_params = sum(v.size for _, v in tree_flatten(model.parameters()))
    print(f"model: qwen2, {n_params} parameters, float32; {length} tokens per training row")

    decay_steps = max(1, cfg.steps - cfg.warmup_steps)
    schedule = optim.join_schedules(
        [
            optim.linear_schedule(0.01 * cfg.learning_rate, cfg.learning_rate, cfg.warmup_steps),
            optim.cosine_decay(cfg.learning_rate, decay_steps, 0.1 * cfg.learning_rate),
        ],
        [cfg.warmup_steps],
    )
    opt = optim.AdamW(learning_rate=schedule, weight_decay=cfg.weight_decay)

    def loss_fn(model, x, y, m):
        logits = model(x).astype(mx.float32)
        ce = nn.losses.cross_entropy(logits, y, reduction="none")
        return (ce * m).sum() / m.sum()

    state = [model.state, opt.state]

    @partial(mx.compile, inputs=state, outputs=state)
    def step(x, y, m):
        loss, grads = nn.value_and_grad(model, loss_fn)(model, x, y, m)
        opt.update(model, grads)
        return loss

    history, losses = [], []
    t0, c0 = time.perf_counter(), time.process_time()
    print(f"step     0  greedy acc {accuracy(model, eval_set, max_new):.3f}", flush=True)
    steps_run = cfg.steps
    for k in range(1, cfg.steps + 1):
        problems = task.problems(cfg.seed, (k - 1) * cfg.batch_size, cfg.batch_size)
        loss = step(*batch_arrays(problems, length))
        mx.eval(loss, state)
        losses.append(loss.item())
        if k % cfg.eval_every == 0 or k == cfg.steps:
            acc = accuracy(model, eval_set, max_new)
            elapsed = time.perf_counter() - t0
            mean_loss = float(np.mean(losses[-cfg.eval_every :]))
            cpu = time.process_time() - c0
            history.append(
                {
                    "step": k,
                    "loss": mean_loss,
                    "greedy_acc": acc,
                    "seconds": elapsed,
                    "cpu_seconds": cpu,
                }
            )
            print(
                f"step {k:5d}  loss {mean_loss:.4f}  greedy acc {acc:.3f}  "
                f"{elapsed:5.0f} s ({cpu:.0f} s cpu)",
                flush=True,
            )
            if acc >= cfg.stop_acc:
                steps_run = k
                print(f"greedy accuracy {acc:.3f} reached --stop-acc {cfg.stop_acc}: stopping")
                break
    return model, history, steps_run, time.perf_counter() - t0, time.process_time() - c0


def evaluate(model, cfg: TrainConfig) -> dict:
    """Greedy and temperature-1 accuracy on the held-out evaluation set and on the prompt
    set, and greedy accuracy by operand size."""
    max_new = cfg.max_digits + 2
    heldout = AdditionTask(cfg.min_digits, cfg.max_digits, "heldout")
    result = {}
    for name, problems in (
        ("eval", heldout.problems(EVAL_SEED, 0, cfg.eval_size)),
        ("prompts", prompt_problems(cfg)),
    ):
        sampled = [
            accuracy(model, problems, max_new, temp=1.0, seed=hash_words(cfg.seed, r))
            for r in range(cfg.sampled_repeats)
        ]
        result[name] = {
            "problems": len(problems),
            "greedy_acc": accuracy(model, problems, max_new),
            "sampled_acc_temp1": float(np.mean(sampled)),
            "sampled_repeats": cfg.sampled_repeats,
        }
    by_digits = {}
    for d in range(cfg.min_digits, cfg.max_digits + 1):
        sub = AdditionTask(d, d, "heldout").problems(EVAL_SEED, 0, 128)
        by_digits[f"{d}+{d} digits"] = accuracy(
            model, [replace(p, width=cfg.max_digits) for p in sub], max_new
        )
    result["eval"]["greedy_acc_by_digits"] = by_digits
    return result


def prompt_problems(cfg: TrainConfig) -> list[Problem]:
    heldout = AdditionTask(cfg.min_digits, cfg.max_digits, "heldout")
    return heldout.problems(PROMPTS_SEED, 0, cfg.num_prompts)


def write_prompts(path: Path, cfg: TrainConfig) -> None:
    with open(path, "w") as f:
        for i, p in enumerate(prompt_problems(cfg)):
            f.write(
                json.dumps({"id": f"add-{i:03d}", "prompt": p.prompt, "answer": p.answer}) + "\n"
            )


def setup_arg_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="directory to write the model to")
    for f in fields(TrainConfig):
        parser.add_argument(
            f"--{f.name.replace('_', '-')}", type=type(f.default), default=f.default
        )
    return parser


def main(argv=None) -> None:
    args = setup_arg_parser().parse_args(argv)
    cfg = TrainConfig(**{f.name: getattr(args, f.name) for f in fields(TrainConfig)})
    mx.set_default_device(mx.cpu)

    model, history, steps_run, seconds, cpu_seconds = train(cfg)
    final = evaluate(model, cfg)
    for name, r in final.items():
        print(
            f"final {name} ({r['problems']} held-out problems): greedy acc {r['greedy_acc']:.3f}, "
            f"sampled (temp 1) acc {r['sampled_acc_temp1']:.3f}"
        )
    print(f"greedy acc by operand size: {final['eval']['greedy_acc_by_digits']}")

    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    save_model(out, model)
    (out / "model.safetensors.index.json").unlink()  # one shard: the index says nothing
    config = {**asdict(model_args(cfg)), "architectures": ["Qwen2ForCausalLM"]}
    config.update(bos_token_id=VOCAB["<bos>"], eos_token_id=EOS_ID, torch_dtype="float32")
    save_config(config, out / "config.json")
    save_tokenizer(out)
    write_prompts(out / "prompts.jsonl", cfg)
    report = {
        "command": " ".join(["python", sys.argv[0], *(sys.argv[1:] if argv is None else argv)]),
        "config": asdict(cfg),
        "steps_run": steps_run,
        "train_seconds": round(seconds, 1),
        "train_cpu_seconds": round(cpu_seconds, 1),
        "history": history,
        "final": final,
        "versions": {"mlx": mx.__version__, "mlx_lm": mlx_lm.__version__, "numpy": np.__version__},
        "platform": platform.platform(),
        "processor": platform.machine(),
    }
    with open(out / "train_report.json", "w") as f:
        json.dump(report, f, indent=2)
        f.write("\n")
    print(f"wrote {out}: {seconds:.0f} s of training ({cpu_seconds:.0f} s cpu)")


if __name__ == "__main__":
    main()
