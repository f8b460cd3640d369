"""The training loop bi-train runs: rollout batches, rewards, gated updates, checkpoints, resume.

Rollout batches come from one of two places:
  - generated (default): every step samples `prompts_per_step` prompts x `n` with the
    current policy, through the engine `bi_rl.batch_generate` runs (keyed sampler, forward
    passes inside batch_invariant_mode). Prompts are the embedded addition task's train
    split (problems (step - 1) * P to step * P - 1 of the seed's stream) or the rows of a
    prompt file, taken in turn and cycled. A generated prompt's id is "s{step}/{row id}",
    so no two steps share a sampling key.
  - rollout logs (`rollouts`): each log is one batch, one step, in the order given. The
    log's sampler temperature is used. Rewards come from a rewards file per log (keyed by
    record hash, bi_rl.score.dataset) or from the reward function. A log is only trained
    on if it was sampled from the current policy: a log of the base model is on-policy for
    fresh adapters (lora_b = 0), so it can be the first batch; the gate refuses any other.

Each batch then goes through bi_rl.train.grpo.train_on_batch (the on-policy gate, GRPO
advantages, clipped updates). Rewards come from a function (bi_rl.train.rewards).

Checkpoints, in `adapter_path`, every `save_every` steps and after the last:
    adapter_config.json, adapters.safetensors   the latest adapters, mlx-lm's format
    {step:07d}_adapters.safetensors             the adapters after that step
    {step:07d}_optimizer.safetensors            the optimizer state after that step
    train_state.json                            the last checkpoint and the configuration
    metrics.jsonl                               one line per step, without timings
train_state.json is written last and atomically, so a killed run resumes from the last
complete checkpoint. `resume` refuses a different configuration (naming the fields),
restores adapters and optimizer state bit for bit, drops metrics lines after the
checkpoint and continues; rollouts are pure functions of the weights, prompts and seed, so
a resumed run writes the same adapter bytes as an uninterrupted one.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import mlx.core as mx
import mlx.optimizers as optim
import numpy as np
from mlx.utils import tree_flatten

from bi_rl.model import load_model, model_digest, resolve_model
from bi_rl.rollout.engine import EngineConfig
from bi_rl.rollout.generate import generate_samples
from bi_rl.rollout.log import iter_records, read_header
from bi_rl.rollout.paths import write_atomic
from bi_rl.rollout.prompts import Prompt
from bi_rl.rollout.sampler import SamplerConfig
from bi_rl.rollout.schema import sample_label
from bi_rl.train.grpo import RolloutBatch, UpdateConfig, train_on_batch
from bi_rl.train.lora import (
    ADAPTERS_FILE,
    LoRAConfig,
    attach,
    load_adapter_weights,
    save_adapters,
    save_weights,
)
from bi_rl.train.rewards import call_reward, load_reward

__all__ = ["TrainConfig", "TrainError", "train"]

STATE_FILE = "train_state.json"
METRICS_FILE = "metrics.jsonl"
DEFAULT_STEPS = 10
DEFAULT_PROMPTS_PER_STEP = 8
DEFAULT_N = 4
DEFAULT_LR = 1e-4
DEFAULT_SAVE_EVERY = 10
DEFAULT_BATCH_SIZE = 32
DEFAULT_MAX_TOKENS = 256  # with a prompt file; the addition task needs its answer + <eos>
# Fields that may differ between a run and its resumption (the model is checked by digest).
RESUMABLE = ("steps", "save_every", "model", "adapter_path")


class TrainError(RuntimeError):
    """A run that cannot start or continue; the message is one line naming the problem."""


@dataclass(frozen=True)
class TrainConfig:
    """Everything a training run needs. model None: the embedded adder.

    The sampler's seed is the run's one seed: it keys the rollouts' sampling, initialises
    the LoRA adapters and picks the addition task's problems.
    """

    model: str | None = None
    adapter_path: str = "adapters"
    steps: int | None = None  # None: one per log, else DEFAULT_STEPS
    prompts: str | None = None  # prompt file; None: the addition task
    prompt_field: str = "prompt"
    id_field: str = "id"
    prompts_per_step: int = DEFAULT_PROMPTS_PER_STEP
    n: int = DEFAULT_N
    max_tokens: int | None = None  # None: the task's answer length + 1, or DEFAULT_MAX_TOKENS
    batch_size: int = DEFAULT_BATCH_SIZE  # rollout decode batch; never changes a bit
    rollouts: tuple[str, ...] = ()
    rewards: tuple[str, ...] = ()
    reward: str | None = None
    sampler: SamplerConfig = field(default_factory=SamplerConfig)
    lr: float = DEFAULT_LR
    lora: LoRAConfig = field(default_factory=LoRAConfig)
    update: UpdateConfig = field(default_factory=UpdateConfig)
    save_every: int = DEFAULT_SAVE_EVERY

    def __post_init__(self):
        for name in ("prompts_per_step", "n", "batch_size", "save_every"):
            if getattr(self, name) < 1:
                raise ValueError(
                    f"{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}"
                )
        if self.steps is not None and self.steps < 1:
            raise ValueError(f"steps must be >= 1, got {self.steps}")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise ValueError(f"max-tokens must be >= 1, got {self.max_tokens}")
        if not (self.lr > 0 and np.isfinite(self.lr)):
            raise ValueError(f"lr must be a positive number, got {self.lr}")
        if self.rewards and len(self.rewards) != len(self.rollouts):
            raise ValueError(
                f"{len(self.rewards)} rewards files for {len(self.rollouts)} logs "
                "(give one per log, or none to use the reward function)"
            )
        if self.rollouts and self.prompts is not None:
            raise ValueError("give rollout logs or a prompt file, not both")
        if self.rollouts and self.steps is not None and self.steps > len(self.rollouts):
            raise ValueError(f"{self.steps} steps but only {len(self.rollouts)} rollout logs")
        if not self.rollouts and self.n < 2:
            raise ValueError("GRPO compares samples of a prompt: n must be >= 2")

    @property
    def seed(self) -> int:
        return self.sampler.seed

    @property
    def total_steps(self) -> int:
        if self.steps is not None:
            return self.steps
        return len(self.rollouts) if self.rollouts else DEFAULT_STEPS

    def to_json(self) -> dict:
        return json.loads(json.dumps(asdict(self)))


# -- sources of rollout batches -----------------------------------------------------------


class _Generated:
    """Fresh samples from the current policy each step."""

    def __init__(self, cfg: TrainConfig, model, tokenizer):
        self.cfg, self.model, self.tokenizer = cfg, model, tokenizer
        if cfg.prompts is None:
            from bi_rl.tasks.addition import AdditionTask

            self.task = AdditionTask(split="train")
            self.rows = None
            self.max_tokens = cfg.max_tokens or self.task.max_digits + 2
        else:
            from bi_rl.rollout.prompts import load_prompts, read_rows

            # load_prompts checks and tokenizes; read_rows keeps the rows for the reward.
            self.prompts = load_prompts(
                cfg.prompts, tokenizer, field=cfg.prompt_field, id_field=cfg.id_field
            )
            self.rows = read_rows(cfg.prompts)
            self.max_tokens = cfg.max_tokens or DEFAULT_MAX_TOKENS

    def _step_prompts(self, step: int) -> tuple[list[Prompt], list[dict]]:
        p = self.cfg.prompts_per_step
        if self.rows is None:
            problems = self.task.problems(self.cfg.seed, (step - 1) * p, p)
            rows = [
                {"id": str((step - 1) * p + i), "prompt": q.prompt, "answer": q.answer}
                for i, q in enumerate(problems)
            ]
            toks = [tuple(self.tokenizer.encode(r["prompt"])) for r in rows]
        else:
            at = [((step - 1) * p + i) % len(self.rows) for i in range(p)]
            rows = [self.rows[i] for i in at]
            toks = [self.prompts[i].tokens for i in at]
            rows = [{**r, "id": self.prompts[i].id} for r, i in zip(rows, at, strict=True)]
        prompts = [Prompt(f"s{step}/{r['id']}", t) for r, t in zip(rows, toks, strict=True)]
        return prompts, rows

    def batch(self, step: int, reward_fn) -> tuple[RolloutBatch, UpdateConfig, str]:
        cfg = self.cfg
        prompts, rows = self._step_prompts(step)
        ecfg = EngineConfig(
            n=cfg.n, max_tokens=self.max_tokens, batch_size=cfg.batch_size, mode=cfg.update.mode
        )
        samples, _ = generate_samples(self.model, self.tokenizer, prompts, cfg.sampler, ecfg)
        rewards = [
            call_reward(
                reward_fn,
                sample_label(s.prompt_id, s.prompt_index, s.sample),
                prompt=str(rows[s.prompt_index].get(cfg.prompt_field, "")),
                completion=_completion_text(self.tokenizer, s),
                finish=s.finish,
                row=rows[s.prompt_index],
                tokens=_completion_tokens(s),
            )
            for s in samples
        ]
        update = replace(cfg.update, temperature=cfg.sampler.temperature)
        return RolloutBatch.from_samples(samples, rewards), update, "generated"


class _Logs:
    """One rollout log per step, checked in full before the first step."""

    def __init__(self, cfg: TrainConfig, tokenizer):
        from bi_rl.score.dataset import read_rewards

        self.cfg, self.tokenizer = cfg, tokenizer
        self.logs = []
        for i, log in enumerate(cfg.rollouts[: cfg.total_steps]):
            header = read_header(log)
            records = list(iter_records(log, verify=True))
            if not records:
                raise TrainError(f"{log}: the log holds no records")
            rewards = read_rewards(cfg.rewards[i], log) if cfg.rewards else None
            self.logs.append((log, header, records, rewards))

    def batch(self, step: int, reward_fn) -> tuple[RolloutBatch, UpdateConfig, str]:
        log, header, records, rewards = self.logs[step - 1]
        if rewards is None:
            rewards = [
                call_reward(
                    reward_fn,
                    f"{log}: {r.label}",
                    prompt=self.tokenizer.decode(list(r.prompt_tokens), skip_special_tokens=True),
                    completion=_completion_text(self.tokenizer, r),
                    finish=r.finish,
                    row={},
                    tokens=_completion_tokens(r),
                )
                for r in records
            ]
        temperature = header.run.sampler.temperature
        update = replace(self.cfg.update, temperature=temperature)
        return RolloutBatch.from_samples(records, rewards), update, str(log)


def _completion_tokens(s) -> list[int]:
    """The completion's token ids without the stop token that ended it."""
    tokens = list(s.tokens)
    return tokens[:-1] if s.finish == "stop" and isinstance(s.stop, int) else tokens


def _completion_text(tokenizer, s) -> str:
    """The completion as text, without its stop token (special tokens kept, so a stray one
    never reads as part of an answer)."""
    return tokenizer.decode(_completion_tokens(s))


# -- checkpoints ----------------------------------------------------------------------------


def _opt_state(opt) -> dict:
    return dict(tree_flatten(opt.state))


def _set_opt_state(opt, model, flat: dict) -> None:
    """Restore a flattened optimizer state into `opt` (initialised for `model`)."""
    opt.init(model.trainable_parameters())
    have = dict(tree_flatten(opt.state))
    if set(have) != set(flat):
        diff = sorted(set(have) ^ set(flat))[0]
        raise TrainError(f"the saved optimizer state does not fit this model ({diff})")

    def put(tree, path, value):
        *head, last = path.split(".")
        for k in head:
            tree = tree[int(k)] if isinstance(tree, list) else tree[k]
        if isinstance(tree, list):
            tree[int(last)] = value
        else:
            tree[last] = value

    state = opt.state
    for k, v in flat.items():
        put(state, k, v)
    mx.eval(opt.state)


def _differences(a: dict, b: dict, prefix: str = "") -> list[str]:
    out = []
    for k in sorted(set(a) | set(b)):
        x, y = a.get(k), b.get(k)
        if isinstance(x, dict) and isinstance(y, dict):
            out += _differences(x, y, f"{prefix}{k}.")
        elif x != y:
            out.append(prefix + k)
    return out


class _Checkpoints:
    def __init__(self, directory: Path, cfg: TrainConfig, model_digest: str):
        self.dir, self.cfg = directory, cfg
        self.extra = {"bi_rl": {"model_digest": model_digest, "train": cfg.to_json()}}

    def exists(self) -> bool:
        return (self.dir / STATE_FILE).exists() or (self.dir / ADAPTERS_FILE).exists()

    def save(self, step: int, model, opt) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        ad = f"{step:07d}_adapters.safetensors"
        op = f"{step:07d}_optimizer.safetensors"
        save_weights(self.dir / ad, dict(tree_flatten(model.trainable_parameters())))
        save_weights(self.dir / op, _opt_state(opt))
        save_adapters(self.dir, model, self.cfg.lora, {**self.extra, "step": step})
        state = {"step": step, "adapters": ad, "optimizer": op, **self.extra}
        write_atomic(self.dir / STATE_FILE, json.dumps(state, indent=2, sort_keys=True).encode())

    def restore(self, model, opt) -> int:
        path = self.dir / STATE_FILE
        if not path.is_file():
            raise TrainError(f"nothing to resume: {path} does not exist (run without --resume)")
        try:
            state = json.loads(path.read_text())
            old_cfg, step = state["bi_rl"]["train"], int(state["step"])
        except (ValueError, KeyError, TypeError):
            raise TrainError(f"{path}: not a bi-train state file") from None
        new = self.cfg.to_json()
        diff = [d for d in _differences(old_cfg, new) if d not in RESUMABLE]
        if state["bi_rl"].get("model_digest") != self.extra["bi_rl"]["model_digest"]:
            diff.insert(0, "model (weights digest)")
        if diff:
            raise TrainError(f"cannot resume: the configuration differs in {', '.join(diff)}")
        load_adapter_weights(model, self.dir / state["adapters"])
        _set_opt_state(opt, model, mx.load(str(self.dir / state["optimizer"])))
        self._truncate_metrics(step)
        return step

    def _truncate_metrics(self, step: int) -> None:
        path = self.dir / METRICS_FILE
        if not path.exists():
            return
        keep = []
        for line in path.read_bytes().splitlines(keepends=True):
            if not line.endswith(b"\n"):
                break  # a torn last line
            if json.loads(line)["step"] > step:
                break
            keep.append(line)
        write_atomic(path, b"".join(keep))


# -- the loop -------------------------------------------------------------------------------


def _step_row(step: int, source: str, batch: RolloutBatch, out: dict) -> dict:
    first, last = out["updates"][0], out["updates"][-1]
    return {
        "step": step,
        "source": source,
        "samples": len(batch),
        "tokens": batch.tokens,
        "reward_mean": float(batch.rewards.mean()),
        "reward_min": float(batch.rewards.min()),
        "reward_max": float(batch.rewards.max()),
        "differing": out["check"]["differing"],
        "k3_mean": out["check"]["k3_mean"],
        "k3_max": out["check"]["k3_max"],
        "ratio_first_min": first["ratio_min"],
        "ratio_first_max": first["ratio_max"],
        "ratio_first_not_1": first["ratio_not_1"],
        "ratio_last_min": last["ratio_min"],
        "ratio_last_max": last["ratio_max"],
        "clipped_last": last["clipped"],
        "loss": first["loss"],
        "grad_norm": first["grad_norm"],
        "updates": len(out["updates"]),
    }


def train(
    cfg: TrainConfig,
    *,
    resume: bool = False,
    progress: Callable[[dict], None] | None = None,
) -> dict:
    """Run `cfg` (module doc); returns a summary with every step's metrics.

    Raises TrainError (bad input or state), OffPolicyError (the gate refused a batch),
    RewardError, LogError, RewardsError or PromptError, each with a one-line message.
    progress(row) is called after every step with that step's metrics.
    """
    reward_fn = load_reward(cfg.reward)
    path, name = resolve_model(cfg.model)
    out = Path(cfg.adapter_path)
    if out.exists() and not out.is_dir():
        raise TrainError(f"--adapter-path {cfg.adapter_path!r} is a file; pass a directory")
    ckpt = _Checkpoints(out, cfg, model_digest(path))
    if not resume and ckpt.exists():
        raise TrainError(
            f"{out} already holds adapters; pass --resume to continue that run or "
            "choose another --adapter-path"
        )
    model, tokenizer = load_model(path)
    source = _Logs(cfg, tokenizer) if cfg.rollouts else _Generated(cfg, model, tokenizer)
    params = attach(model, cfg.lora, cfg.seed)
    opt = optim.Adam(learning_rate=cfg.lr)
    start = ckpt.restore(model, opt) + 1 if resume else 1
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    with open(out / METRICS_FILE, "ab") as metrics:
        for step in range(start, cfg.total_steps + 1):
            batch, update, where = source.batch(step, reward_fn)
            result = train_on_batch(model, opt, batch, update)
            row = _step_row(step, where, batch, result)
            metrics.write(json.dumps(row, sort_keys=True).encode() + b"\n")
            metrics.flush()
            if step % cfg.save_every == 0 or step == cfg.total_steps:
                os.fsync(metrics.fileno())
                ckpt.save(step, model, opt)
            rows.append(row)
            if progress is not None:
                progress(row)
    return {
        "model": name,
        "adapter_path": str(out),
        "trainable_parameters": params,
        "start_step": start,
        "steps": cfg.total_steps,
        "rows": rows,
    }
