"""LoRA adapters for any mlx-lm model, in mlx-lm's own format, initialised from a seed.

`attach(model, config, seed)` freezes the model and turns the linear layers of its last
`num_layers` blocks into mlx-lm's LoRA layers (mlx_lm.tuner.utils.linear_to_lora_layers),
with dropout 0: a dropped activation would make the trainer's forward pass differ from the
rollout's. mlx-lm draws each `lora_a` from MLX's global random state; here every one is
redrawn from a key derived from (seed, layer name), so the adapters a run starts from are a
function of its seed. `lora_b` starts at zero, so a fresh adapter leaves every output of the
base model unchanged (y + 0 = y exactly) and the base model's rollouts are on-policy for it.

With fine_tune_type "full" nothing is attached and every parameter trains.

`save_adapters(directory, model, config)` writes `adapters.safetensors` (the trainable
parameters) and `adapter_config.json` the way `mlx_lm.lora` does, so
`mlx_lm.load(model, adapter_path=directory)` loads the result; `load_adapter_weights`
reads such a file back into an attached model, checking every name and shape.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

import mlx.core as mx
from mlx.utils import tree_flatten

from bi_rl.rollout.paths import write_atomic

__all__ = [
    "ADAPTERS_FILE",
    "CONFIG_FILE",
    "FINE_TUNE_TYPES",
    "LoRAConfig",
    "attach",
    "load_adapter_weights",
    "save_adapters",
    "save_weights",
    "trainable",
]

ADAPTERS_FILE = "adapters.safetensors"
CONFIG_FILE = "adapter_config.json"
FINE_TUNE_TYPES = ("lora", "full")
# mlx-lm's rank and scale defaults (mlx_lm.lora CONFIG_DEFAULTS); every block by default
# (mlx-lm's 16 would refuse the embedded two-block model).
DEFAULT_RANK = 8
DEFAULT_SCALE = 20.0
DEFAULT_NUM_LAYERS = -1


@dataclass(frozen=True)
class LoRAConfig:
    """Which layers train and how: rank and scale of the LoRA update, blocks adapted."""

    fine_tune_type: str = "lora"
    rank: int = DEFAULT_RANK
    scale: float = DEFAULT_SCALE
    num_layers: int = DEFAULT_NUM_LAYERS  # the last blocks adapted; -1 for all
    keys: tuple[str, ...] | None = field(default=None)  # module names in a block; None: all

    def __post_init__(self):
        if self.fine_tune_type not in FINE_TUNE_TYPES:
            raise ValueError(
                f"fine-tune type must be one of {', '.join(FINE_TUNE_TYPES)}, "
                f"got {self.fine_tune_type!r}"
            )
        if self.rank < 1:
            raise ValueError(f"LoRA rank must be >= 1, got {self.rank}")
        if not math.isfinite(self.scale):
            raise ValueError(f"LoRA scale must be finite, got {self.scale}")
        if self.num_layers < 1 and self.num_layers != -1:
            raise ValueError(f"num_layers must be >= 1 or -1 (all), got {self.num_layers}")

    def mlx_lm_config(self) -> dict:
        """adapter_config.json in mlx_lm.lora's shape (what mlx_lm.load reads back)."""
        params = {"rank": self.rank, "scale": self.scale, "dropout": 0.0}
        if self.keys is not None:
            params["keys"] = list(self.keys)
        return {
            "fine_tune_type": self.fine_tune_type,
            "num_layers": self.num_layers,
            "lora_parameters": params,
        }


def _key(seed: int, name: str) -> mx.array:
    d = hashlib.blake2b(f"{seed}:{name}".encode(), digest_size=8, person=b"bi-rl/lora").digest()
    return mx.random.key(int.from_bytes(d, "little"))


def attach(model, config: LoRAConfig, seed: int = 0) -> int:
    """Make `model` trainable per `config`; returns the number of trainable parameters."""
    if config.fine_tune_type == "full":
        model.unfreeze()
        return trainable(model)
    from mlx_lm.tuner.lora import LoRALinear
    from mlx_lm.tuner.utils import linear_to_lora_layers

    blocks = len(model.layers)
    if config.num_layers > blocks:
        raise ValueError(f"num_layers {config.num_layers} exceeds the model's {blocks} blocks")
    model.freeze()
    layers = blocks if config.num_layers == -1 else config.num_layers
    linear_to_lora_layers(model, layers, config.mlx_lm_config()["lora_parameters"])
    adapted = sorted((n, m) for n, m in model.named_modules() if isinstance(m, LoRALinear))
    if not adapted:
        raise ValueError("no linear layer was adapted (check the LoRA keys)")
    for name, m in adapted:
        fan_in, r = m.lora_a.shape
        bound = 1 / math.sqrt(fan_in)
        m.lora_a = mx.random.uniform(-bound, bound, (fan_in, r), key=_key(seed, name))
    mx.eval(model.parameters())
    return trainable(model)


def trainable(model) -> int:
    return sum(v.size for _, v in tree_flatten(model.trainable_parameters()))


def save_weights(path: Path, weights: dict) -> None:
    """mx.save_safetensors through a temporary name, then an atomic rename."""
    tmp = path.with_name(f".{path.stem}.tmp.safetensors")
    mx.save_safetensors(str(tmp), weights)
    os.replace(tmp, path)


def save_adapters(directory, model, config: LoRAConfig, extra: dict | None = None) -> Path:
    """Write adapters.safetensors and adapter_config.json (mlx-lm's format) in `directory`.

    extra: more adapter_config.json fields (mlx-lm ignores what it does not know).
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    save_weights(directory / ADAPTERS_FILE, dict(tree_flatten(model.trainable_parameters())))
    cfg = {**config.mlx_lm_config(), **(extra or {})}
    write_atomic(directory / CONFIG_FILE, json.dumps(cfg, indent=2, sort_keys=True).encode())
    return directory / ADAPTERS_FILE


def load_adapter_weights(model, path) -> None:
    """Load trainable weights saved by save_adapters into an attached model, exactly."""
    weights = mx.load(str(path))
    want = dict(tree_flatten(model.trainable_parameters()))
    extra = sorted(set(weights) - set(want))
    missing = sorted(set(want) - set(weights))
    if extra or missing:
        what = f"unexpected {extra[0]}" if extra else f"missing {missing[0]}"
        raise ValueError(f"{path}: adapters do not fit this model and LoRA setup ({what})")
    kind = lambda a: f"{str(a.dtype).rsplit('.', 1)[-1]}{tuple(a.shape)}"
    for k, w in weights.items():
        if w.shape != want[k].shape or w.dtype != want[k].dtype:
            raise ValueError(f"{path}: {k} is {kind(w)}, the model wants {kind(want[k])}")
    model.load_weights(list(weights.items()), strict=False)
    mx.eval(model.parameters())
