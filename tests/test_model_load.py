"""bi_rl.model.load and bi_rl.model.tokenizer: loading without mlx-lm's tokenizer stack.

Properties: a directory the direct loader takes gives the model mlx_lm.load gives, every
parameter bitwise equal (float, bfloat16 and 4-bit weights, tied and untied embeddings);
its tokenizer encodes and decodes as tokenizer.json does and names mlx-lm's EOS ids; the
embedded default loads and generates without importing transformers, and mlx-lm stays
whole for later imports; every directory the loader cannot reproduce is left to mlx-lm.
"""

import json
import os
import shutil
import subprocess
import sys

import mlx.core as mx
import mlx_lm
import numpy as np
import pytest
from mlx.utils import tree_flatten
from tiny_models import CHAT_TEMPLATE, build_model

from bi_rl.assets import DEFAULT_MODEL, DEFAULT_PROMPTS
from bi_rl.model import load_model
from bi_rl.model.load import DIRECT_TYPES, LOADER_ENV, direct_load
from bi_rl.model.tokenizer import FastTokenizer

TEXTS = ["651+058=", "hello world 1+2=3", "a\nb", "<|user|>hi<eos>", "  x  ", "", "zz?!"]


def _bits(a):
    a = np.array(a.astype(mx.float32)) if a.dtype == mx.bfloat16 else np.array(a)
    return a.view(np.uint8)


def _quantized(src, dst):
    model, _ = mlx_lm.load(str(src))
    import mlx.nn as nn
    from mlx_lm.utils import save_config, save_model

    nn.quantize(model, group_size=64, bits=4)
    shutil.copytree(src, dst)
    (dst / "model.safetensors").unlink()
    save_model(dst, model)
    config = json.loads((src / "config.json").read_text())
    config["quantization"] = {"group_size": 64, "bits": 4}
    save_config(config, dst / "config.json")
    return dst


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("load")
    out = {
        "qwen2": build_model(root / "qwen2"),
        "llama": build_model(root / "llama", arch="llama", key=1),
        "bf16": build_model(root / "bf16", dtype="bfloat16", key=2),
    }
    out["q4"] = _quantized(out["qwen2"], root / "q4")
    return out


@pytest.mark.parametrize("name", ["qwen2", "llama", "bf16", "q4", "default"])
def test_direct_load_builds_the_model_mlx_lm_builds(dirs, name):
    path = DEFAULT_MODEL if name == "default" else dirs[name]
    loaded = direct_load(path)
    assert loaded is not None, "the direct path must take this directory"
    ours, tok = loaded
    theirs, ref = mlx_lm.load(str(path))
    a, b = dict(tree_flatten(ours.parameters())), dict(tree_flatten(theirs.parameters()))
    assert sorted(a) == sorted(b)
    for k in a:
        assert a[k].dtype == b[k].dtype and a[k].shape == b[k].shape, k
        assert np.array_equal(_bits(a[k]), _bits(b[k])), f"parameter {k} differs"
    assert type(ours) is type(theirs) and not ours.training
    assert isinstance(tok, FastTokenizer)
    assert tok.eos_token_ids == ref.eos_token_ids
    assert (tok.eos_token_id, tok.pad_token_id) == (ref.eos_token_id, ref.pad_token_id)


def test_tokenizer_reads_tokenizer_json(dirs):
    """Encoding and decoding are tokenizer.json's (with its special tokens added)."""
    from tokenizers import Tokenizer

    for path in (dirs["qwen2"], DEFAULT_MODEL):
        tok = direct_load(path)[1]
        raw = Tokenizer.from_file(str(path / "tokenizer.json"))
        for text in TEXTS:
            ids = raw.encode(text).ids
            assert tok.encode(text) == ids, text
            assert tok.decode(ids) == raw.decode(ids, skip_special_tokens=False)


def test_default_prompts_tokenize_as_mlx_lm_does():
    """The embedded default's prompts: the same ids through either loader (the golden logs
    hold them)."""
    tok = direct_load(DEFAULT_MODEL)[1]
    ref = mlx_lm.load(str(DEFAULT_MODEL))[1]
    rows = [json.loads(line) for line in DEFAULT_PROMPTS.read_text().splitlines()]
    for r in rows:
        assert tok.encode(r["prompt"]) == ref.encode(r["prompt"])
        ids = tok.encode(r["prompt"] + r["answer"])
        assert tok.decode(ids) == ref.decode(ids)


def test_other_attributes_come_from_mlx_lms_tokenizer(dirs):
    tok = direct_load(dirs["qwen2"])[1]
    detok = tok.detokenizer  # not FastTokenizer's own: mlx-lm's, loaded on this use
    detok.reset()
    for i in tok.encode("12+3", add_special_tokens=False):
        detok.add_token(i)
    detok.finalize()
    assert detok.text == "12+3"


def _edit_json(path, **changes):
    data = json.loads(path.read_text())
    for k, v in changes.items():
        if v is None:
            data.pop(k, None)
        else:
            data[k] = v
    path.write_text(json.dumps(data))


@pytest.mark.parametrize(
    "case",
    [
        "chat template",
        "template file",
        "tokenizer class",
        "unknown entry",
        "missing special token",
        "bos flag disagrees",
        "quantization_config",
        "model type",
        "environment",
    ],
)
def test_directories_it_cannot_reproduce_go_to_mlx_lm(dirs, tmp_path, monkeypatch, case):
    path = tmp_path / "m"
    if case == "chat template":
        build_model(path, chat_template=CHAT_TEMPLATE)
    else:
        shutil.copytree(dirs["qwen2"], path)
    assert case == "chat template" or direct_load(path) is not None  # the control
    tc, cfg = path / "tokenizer_config.json", path / "config.json"
    if case == "template file":
        (path / "chat_template.jinja").write_text(CHAT_TEMPLATE)
    elif case == "tokenizer class":
        _edit_json(tc, tokenizer_class="Qwen2Tokenizer")
    elif case == "unknown entry":
        _edit_json(tc, do_lower_case=True)
    elif case == "missing special token":
        _edit_json(tc, bos_token="<s>")
    elif case == "bos flag disagrees":
        _edit_json(tc, add_bos_token=True, bos_token="<pad>")
    elif case == "quantization_config":
        _edit_json(cfg, quantization_config={"quant_method": "awq"})
    elif case == "model type":
        _edit_json(cfg, model_type="gemma3_text")
    elif case == "environment":
        monkeypatch.setenv(LOADER_ENV, "mlx-lm")
    assert direct_load(path) is None
    if case not in ("model type", "quantization_config"):  # (mlx-lm cannot load those edits)
        assert not isinstance(load_model(path)[1], FastTokenizer)


def test_direct_types_are_mlx_lms_own_modules():
    from mlx_lm.utils import _get_classes

    for model_type, module in DIRECT_TYPES.items():
        cls, _ = _get_classes({"model_type": model_type})
        assert cls.__module__ == f"mlx_lm.models.{module}"


def test_default_rollout_never_imports_transformers(tmp_path):
    """The embedded default loads and generates without transformers; mlx_lm is still whole
    afterwards (its package code runs on first use)."""
    code = (
        "import sys\n"
        "from bi_rl.cli.rollout import main\n"
        f"assert main(['--out', {str(tmp_path / 'r.jsonl')!r}, '--limit', '2', '--quiet']) == 0\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('transformers', 'torch'))\n"
        "assert not heavy, heavy\n"
        "import mlx_lm\n"
        "assert callable(mlx_lm.load) and callable(mlx_lm.batch_generate)\n"
        "assert 'transformers' in sys.modules\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
