"""bi-train: GRPO with LoRA adapters on any mlx-lm model, every batch checked on-policy to the bit.

    bi-train                                      # the embedded adder and addition task
    bi-train --model DIR --prompts FILE --reward my_rewards:score --steps 50
    bi-train --model DIR --rollouts run.jsonl --rewards rewards.jsonl --epochs 4
    bi-train ... --resume                         # continue from the last checkpoint
    python -m bi_rl.cli.train --help

Before the first update on each rollout batch the trainer recomputes every sampled token's
logprob at the rollout policy and compares bits; one differing bit stops the run (exit 1)
naming the first divergent token. Adapters are saved in mlx-lm's format (--adapter-path),
loadable with mlx_lm.load(MODEL, adapter_path=DIR). bi_rl/train/loop.py has the details.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from bi_rl.cli import add_sampling_args, sampler_config, settings_refused
from bi_rl.mode import MODES

PROG = "bi-train"
EXIT_OK, EXIT_OFF_POLICY, EXIT_BAD_INPUT, EXIT_INTERRUPTED = 0, 1, 2, 130


def setup_arg_parser() -> argparse.ArgumentParser:
    from bi_rl.train.grpo import UpdateConfig
    from bi_rl.train.loop import TrainConfig
    from bi_rl.train.lora import FINE_TUNE_TYPES, LoRAConfig

    t, lo, up = TrainConfig(), LoRAConfig(), UpdateConfig()
    p = argparse.ArgumentParser(
        prog=PROG,
        description="GRPO / PPO-style training of LoRA adapters (or all weights) for an mlx-lm "
        "model, on rollouts that are checked on-policy bit for bit before every batch's first "
        "update. With no --model, trains the embedded adder on the addition task.",
    )
    src = p.add_argument_group("model, prompts and rewards")
    src.add_argument("--model", help="mlx-lm model directory (default: the embedded adder)")
    src.add_argument(
        "--prompts",
        help="prompt file (.jsonl, .json, .csv, .parquet) to sample "
        "from (default: the addition task's train split)",
    )
    src.add_argument("--prompt-field", default=t.prompt_field, help="default: %(default)s")
    src.add_argument("--id-field", default=t.id_field, help="default: %(default)s")
    src.add_argument(
        "--rollouts",
        nargs="+",
        default=[],
        metavar="LOG",
        help="train on these rollout logs instead, one batch (step) each",
    )
    src.add_argument(
        "--rewards",
        nargs="+",
        default=[],
        metavar="FILE",
        help="rewards files keyed by record hash, one per --rollouts log",
    )
    src.add_argument(
        "--reward",
        metavar="MODULE:FUNCTION",
        help="reward function, module:function or path/file.py:function, called with those "
        "of prompt=, completion=, finish=, row=, tokens= it names, returning a number "
        "(default: the addition task's)",
    )
    smp = p.add_argument_group("rollouts")
    smp.add_argument(
        "--prompts-per-step",
        type=int,
        default=t.prompts_per_step,
        help="prompts per step (default: %(default)s)",
    )
    smp.add_argument(
        "--n",
        type=int,
        default=t.n,
        help="samples per prompt, the GRPO group (default: %(default)s)",
    )
    smp.add_argument(
        "--max-tokens",
        type=int,
        help="completion length limit (default: the addition answer + 1, or 256 with --prompts)",
    )
    add_sampling_args(smp, seed_help="sampling, LoRA init and task seed")
    smp.add_argument(
        "--batch-size",
        type=int,
        default=t.batch_size,
        help="sequences decoded together (default: %(default)s); never changes a bit",
    )
    tr = p.add_argument_group("training")
    tr.add_argument("--steps", type=int, help="default: 10, or one per --rollouts log")
    tr.add_argument(
        "--lr", type=float, default=t.lr, help="Adam learning rate (default: %(default)s)"
    )
    tr.add_argument("--clip", type=float, default=up.clip, help="ratio clip (default: %(default)s)")
    tr.add_argument(
        "--epochs",
        type=int,
        default=up.epochs,
        help="passes over each batch; after the first update the logged logprobs "
        "are the behaviour policy, as in PPO (default: %(default)s)",
    )
    tr.add_argument(
        "--minibatch-size", type=int, help="samples per optimizer step (default: the whole batch)"
    )
    tr.add_argument(
        "--fine-tune-type",
        choices=FINE_TUNE_TYPES,
        default=lo.fine_tune_type,
        help="default: %(default)s",
    )
    tr.add_argument("--lora-rank", type=int, default=lo.rank, help="default: %(default)s")
    tr.add_argument("--lora-scale", type=float, default=lo.scale, help="default: %(default)s")
    tr.add_argument(
        "--num-layers",
        type=int,
        default=lo.num_layers,
        help="last blocks given adapters, -1 for all (default: %(default)s)",
    )
    tr.add_argument(
        "--mode",
        choices=MODES,
        default=up.mode,
        help="batch_invariant_mode for rollouts and the trainer's logprobs: strict "
        "(default), fallback, or off (stock MLX: a control)",
    )
    tr.add_argument(
        "--allow-off-policy",
        action="store_true",
        help="report the gate's mismatch and train anyway (a stock-MLX control run)",
    )
    out = p.add_argument_group("output")
    out.add_argument(
        "--adapter-path", default=t.adapter_path, help="checkpoint directory (default: %(default)s)"
    )
    out.add_argument(
        "--save-every",
        type=int,
        default=t.save_every,
        help="checkpoint every N steps and after the last (default: %(default)s)",
    )
    out.add_argument("--resume", action="store_true", help="continue the run in --adapter-path")
    out.add_argument("-q", "--quiet", action="store_true", help="no per-step lines")
    return p


def _config(args):
    from bi_rl.train.grpo import UpdateConfig
    from bi_rl.train.loop import TrainConfig
    from bi_rl.train.lora import LoRAConfig

    return TrainConfig(
        model=args.model,
        adapter_path=args.adapter_path,
        steps=args.steps,
        prompts=args.prompts,
        prompt_field=args.prompt_field,
        id_field=args.id_field,
        prompts_per_step=args.prompts_per_step,
        n=args.n,
        max_tokens=args.max_tokens,
        batch_size=args.batch_size,
        rollouts=tuple(args.rollouts),
        rewards=tuple(args.rewards),
        reward=args.reward,
        sampler=sampler_config(args),
        lr=args.lr,
        lora=LoRAConfig(args.fine_tune_type, args.lora_rank, args.lora_scale, args.num_layers),
        update=UpdateConfig(
            clip=args.clip,
            epochs=args.epochs,
            minibatch_size=args.minibatch_size,
            mode=args.mode,
            allow_off_policy=args.allow_off_policy,
        ),
        save_every=args.save_every,
    )


def _g(x: float) -> str:
    return f"{x:.6g}"


def show(row: dict, total: int, seconds: float) -> str:
    """One step's line: reward, the gate, the updates."""
    exact = row["differing"] == 0 and row["ratio_first_not_1"] == 0
    gate = (
        f"on-policy: {row['differing']} of {row['tokens']} tokens differ, k3 "
        f"{_g(row['k3_max'])} max, first-update ratios "
        + (
            "all exactly 1"
            if exact
            else f"{_g(row['ratio_first_min'])}..{_g(row['ratio_first_max'])} "
            f"({row['ratio_first_not_1']} not 1)"
        )
    )
    later = ""
    if row["updates"] > 1:
        later = (
            f"  last update ratios {_g(row['ratio_last_min'])}..{_g(row['ratio_last_max'])}"
            f" ({row['clipped_last']} clipped)"
        )
    return (
        f"step {row['step']:>{len(str(total))}}/{total}  reward {row['reward_mean']:.3f}  "
        f"{gate}  loss {_g(row['loss'])}  grad norm {_g(row['grad_norm'])}{later}  "
        f"{seconds:.1f} s"
    )


def main(argv=None) -> int:
    args = setup_arg_parser().parse_args(argv)
    if settings_refused(PROG):
        return 2
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    import bi_rl
    from bi_rl.model import ModelError
    from bi_rl.rollout.log import LogError
    from bi_rl.rollout.prompts import PromptError
    from bi_rl.score.dataset import RewardsError
    from bi_rl.train.grpo import OffPolicyError
    from bi_rl.train.loop import TrainError, train
    from bi_rl.train.rewards import RewardError

    clock = {"t": time.perf_counter()}
    say = (lambda s: None) if args.quiet else (lambda s: print(s, flush=True))

    def progress(row):
        now = time.perf_counter()
        say(show(row, cfg.total_steps, now - clock["t"]))
        clock["t"] = now

    try:
        cfg = _config(args)
        source = (
            f"{len(cfg.rollouts)} rollout log(s)"
            if cfg.rollouts
            else f"{cfg.prompts_per_step} prompts x {cfg.n} samples per step from "
            f"{cfg.prompts or 'the addition task'}"
        )
        lora = cfg.lora
        what = (
            "all weights"
            if lora.fine_tune_type == "full"
            else f"LoRA rank {lora.rank} scale {lora.scale:g} on "
            f"{'all' if lora.num_layers == -1 else f'the last {lora.num_layers}'} blocks"
        )
        say(
            f"{PROG}: {cfg.model or 'embedded adder'}, {what}; {source}; mode "
            f"{cfg.update.mode}, backend {bi_rl.active_backend().name}, lr {cfg.lr:g}"
        )
        summary = train(cfg, resume=args.resume, progress=progress)
    except OffPolicyError as e:
        print(f"{PROG}: stopped: {e}", file=sys.stderr)
        return EXIT_OFF_POLICY
    except (
        TrainError,
        ModelError,
        PromptError,
        LogError,
        RewardsError,
        RewardError,
        ValueError,
        NotImplementedError,
    ) as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print(f"\n{PROG}: interrupted; continue with --resume", file=sys.stderr)
        return EXIT_INTERRUPTED
    rows = summary["rows"]
    if rows:
        k = max(1, min(10, len(rows) // 3))
        first = sum(r["reward_mean"] for r in rows[:k]) / k
        last = sum(r["reward_mean"] for r in rows[-k:]) / k
        tokens = sum(r["tokens"] for r in rows)
        differing = sum(r["differing"] for r in rows)
        say(
            f"{PROG}: steps {summary['start_step']}-{summary['steps']}; reward: mean of the "
            f"first {k} steps {first:.3f} -> last {k} {last:.3f}; on-policy: {differing} of "
            f"{tokens} tokens differed; {summary['trainable_parameters']:,} trainable "
            f"parameters; adapters in {summary['adapter_path']}"
        )
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
