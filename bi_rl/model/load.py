"""Loading an mlx-lm model directory without importing mlx-lm's tokenizer stack.

`import mlx_lm` (or of any of its submodules) first runs the package's `__init__`, which
imports mlx-lm's generation and conversion code and, through them, transformers (and torch
where it is installed): seconds before a single weight is read, and nothing a model
definition needs. `direct_load(path)` builds the model from mlx-lm's own model classes
(`mlx_lm.models.<type>`) with the package's `__init__` deferred (`models_module`), loads the
weights as `mlx_lm.utils.load_model` does, and reads the tokenizer through the `tokenizers`
library (bi_rl.model.tokenizer).

It takes only the directories where that builds exactly the model `mlx_lm.load` builds,
and returns None for the rest, which then load through mlx-lm:
  - a model type of `DIRECT_TYPES` (the module mlx-lm itself maps that type to),
  - weights in `model*.safetensors`, unquantized or quantized by mlx-lm in affine mode (a
    "quantization" entry in config.json; no other format's "quantization_config"), no
    custom model file, no activation quantization,
  - a tokenizer that bi_rl.model.tokenizer can read (its doc says how that reading can
    differ from transformers').
Tests load the same directories both ways and compare every parameter bitwise.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import sys
from pathlib import Path

__all__ = ["DIRECT_TYPES", "LOADER_ENV", "direct_load", "models_module", "read_config"]

# config.json model_type -> module of mlx_lm.models (mlx-lm's own mapping for these types).
DIRECT_TYPES = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3"}
LOADER_ENV = "BI_RL_LOADER"  # "mlx-lm": always load through mlx_lm.load
_FLOAT_TAG = "__float__"  # mlx-lm's tag for non-finite floats in a config


class _NotDirect(Exception):
    """The directory needs mlx-lm's own loader."""


def models_module(name: str):
    """mlx_lm.models.<name>, imported without running mlx_lm/__init__.py first.

    The package module is registered bare (its path, no code run); its first attribute
    access other than a submodule runs the real `__init__`, so `import mlx_lm` elsewhere in
    the process still gets the whole package (mlx_lm.load, batch_generate, ...).
    """
    if "mlx_lm" not in sys.modules:
        spec = importlib.util.find_spec("mlx_lm")
        if spec is None:
            raise ImportError("mlx-lm is not installed")
        package = importlib.util.module_from_spec(spec)

        def complete(attr):
            del package.__dict__["__getattr__"]
            spec.loader.exec_module(package)
            return getattr(package, attr)

        package.__getattr__ = complete
        sys.modules["mlx_lm"] = package
    return importlib.import_module(f"mlx_lm.models.{name}")


def read_config(path: Path) -> dict:
    """config.json, with generation_config.json's eos_token_id where it has one (as mlx-lm)."""
    with open(path / "config.json", encoding="utf-8") as f:
        config = json.load(f)
    gen = path / "generation_config.json"
    if gen.is_file():
        try:
            with open(gen, encoding="utf-8") as f:
                eos = json.load(f).get("eos_token_id", False)
        except (json.JSONDecodeError, AttributeError):
            eos = False
        if eos:
            config["eos_token_id"] = eos
    return config


def _check_config(path: Path, config: dict) -> str:
    """The mlx_lm.models module for `config`, or _NotDirect."""
    module = DIRECT_TYPES.get(config.get("model_type"))
    text_config = config.get("text_config") or {}
    # Another format's quantization (mlx-lm reads it only where "quantization" is absent).
    foreign = "quantization" not in config and (
        "quantization_config" in config
        or "quantization_config" in text_config
        or (path / "hf_quant_config.json").exists()
    )
    if (
        module is None
        or foreign
        or any(k in config for k in ("model_file", "quantize_activations"))
        or _FLOAT_TAG in json.dumps(config)
    ):
        raise _NotDirect
    q = config.get("quantization")
    if q is not None and (not isinstance(q, dict) or q.get("mode", "affine") != "affine"):
        raise _NotDirect
    return module


def _quantize(model, config: dict, weights: dict) -> None:
    """mlx-lm's quantization of a model it saved: per-layer overrides from the config, else
    each layer whose weights carry scales, with its group size and bits read off them."""
    import mlx.core as mx
    import mlx.nn as nn

    q = config["quantization"]

    def predicate(p, m):
        if p in q:
            return q[p]
        if not hasattr(m, "to_quantized") or f"{p}.scales" not in weights:
            return False
        scales = weights[f"{p}.scales"]
        if scales.dtype == mx.uint8 or f"{p}.global_scale" in weights:
            raise _NotDirect  # not affine: mlx-lm's loader knows these modes
        in_dims = m.weight.shape[-1]
        bits = weights[f"{p}.weight"].shape[-1] * 32 // in_dims
        return {"group_size": in_dims // scales.shape[-1], "bits": bits, "mode": "affine"}

    nn.quantize(
        model,
        group_size=q["group_size"],
        bits=q["bits"],
        mode=q.get("mode", "affine"),
        class_predicate=predicate,
    )


def direct_load(path: Path):
    """(model, tokenizer) for `path`, or None where mlx_lm.load must do it (module doc)."""
    if os.environ.get(LOADER_ENV) == "mlx-lm":
        return None
    from bi_rl.model.tokenizer import FastTokenizer

    path = Path(path)
    try:
        config = read_config(path)
        module = models_module(_check_config(path, config))
        tokenizer = FastTokenizer.open(path, config)
        files = sorted(path.glob("model*.safetensors"))
        if tokenizer is None or not files:
            return None
        import mlx.core as mx

        weights = {}
        for f in files:
            weights.update(mx.load(str(f)))
        model = module.Model(module.ModelArgs.from_dict(config))
        if hasattr(model, "sanitize"):
            weights = model.sanitize(weights)
        if config.get("quantization") is not None:
            _quantize(model, config, weights)
        model.eval()
        model.load_weights(list(weights.items()), strict=True)
        mx.eval(model.parameters())
    except _NotDirect:
        return None
    return model, tokenizer
