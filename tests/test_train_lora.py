"""bi_rl.train.lora: seeded LoRA adapters in mlx-lm's format.

Properties: the initial adapters are a function of the seed (same seed, same bits; another
seed, other bits) and leave the base model's logits bitwise unchanged (lora_b = 0; a
guard shows nonzero lora_b changes them); saved adapters load with mlx_lm.load(...,
adapter_path=) into a model whose logits are bitwise the trained in-memory model's, for
LoRA and full fine-tuning; adapters for another setup are refused naming the tensor;
num_layers picks the last blocks and is checked against the model.
"""

import mlx.core as mx
import mlx_lm
import numpy as np
import pytest
from mlx.utils import tree_flatten
from tiny_models import build_model

from bi_rl.train.lora import LoRAConfig, attach, load_adapter_weights, save_adapters

X = mx.array([[5, 9, 14, 7, 30, 2, 11]])


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_model(
        tmp_path_factory.mktemp("lora") / "m", arch="qwen3", hidden=64, heads=1, layers=3
    )


def _bits(a: mx.array) -> np.ndarray:
    return np.array(a).view(np.uint32)


def _adapters(model) -> dict:
    return {k: np.array(v) for k, v in tree_flatten(model.trainable_parameters())}


def _nudge(model, key=0) -> None:
    """Move every trainable parameter, as training would."""
    new = [
        (k, v + 0.01 * mx.random.normal(v.shape, key=mx.random.key(key + i)))
        for i, (k, v) in enumerate(tree_flatten(model.trainable_parameters()))
    ]
    model.load_weights(new, strict=False)
    mx.eval(model.parameters())


def test_initial_adapters_are_a_function_of_the_seed_and_change_nothing(model_dir):
    base, _ = mlx_lm.load(str(model_dir))
    ref = _bits(base(X))
    a, _ = mlx_lm.load(str(model_dir))
    b, _ = mlx_lm.load(str(model_dir))
    c, _ = mlx_lm.load(str(model_dir))
    n = attach(a, LoRAConfig(rank=4), seed=7)
    attach(b, LoRAConfig(rank=4), seed=7)
    attach(c, LoRAConfig(rank=4), seed=8)
    wa, wb, wc = _adapters(a), _adapters(b), _adapters(c)
    assert n == sum(v.size for v in wa.values()) > 0
    assert all(np.array_equal(wa[k], wb[k]) for k in wa), "same seed, same adapters"
    assert any(not np.array_equal(wa[k], wc[k]) for k in wa if k.endswith("lora_a"))
    assert np.array_equal(_bits(a(X)), ref), "fresh adapters (lora_b = 0) change no bit"
    _nudge(a)
    assert not np.array_equal(_bits(a(X)), ref), "guard: nonzero adapters do change logits"


@pytest.mark.parametrize("kind", ["lora", "full"])
def test_saved_adapters_load_in_mlx_lm_bit_for_bit(model_dir, tmp_path, kind):
    model, _ = mlx_lm.load(str(model_dir))
    cfg = LoRAConfig(fine_tune_type=kind, rank=4, num_layers=2)
    attach(model, cfg, seed=0)
    _nudge(model)
    save_adapters(tmp_path, model, cfg, {"note": "extra fields are ignored by mlx-lm"})
    loaded, _ = mlx_lm.load(str(model_dir), adapter_path=str(tmp_path))
    assert np.array_equal(_bits(loaded(X)), _bits(model(X)))
    again, _ = mlx_lm.load(str(model_dir))
    attach(again, cfg, seed=1)
    load_adapter_weights(again, tmp_path / "adapters.safetensors")
    assert np.array_equal(_bits(again(X)), _bits(model(X)))


def test_layers_and_mismatched_adapters_are_checked(model_dir, tmp_path):
    model, _ = mlx_lm.load(str(model_dir))
    attach(model, LoRAConfig(rank=4, num_layers=1), seed=0)
    names = {k.split(".")[2] for k in _adapters(model)}
    assert names == {"2"}, "num_layers=1 adapts the last block only"
    save_adapters(tmp_path, model, LoRAConfig(rank=4, num_layers=1))
    other, _ = mlx_lm.load(str(model_dir))
    attach(other, LoRAConfig(rank=2, num_layers=1), seed=0)
    with pytest.raises(ValueError, match=r"lora_a is float32\(\d+, 4\), the model wants"):
        load_adapter_weights(other, tmp_path / "adapters.safetensors")
    with pytest.raises(ValueError, match="exceeds the model's 3 blocks"):
        attach(mlx_lm.load(str(model_dir))[0], LoRAConfig(num_layers=4))
    with pytest.raises(ValueError, match="num_layers must be >= 1 or -1"):
        LoRAConfig(num_layers=0)
