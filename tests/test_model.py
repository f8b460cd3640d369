"""bi_rl.model: what a log's header records about the model, tokenizer and environment.

Properties: the model digest changes with any byte of the weights or config and not with
unrelated files; the tokenizer digest changes with the tokenizer files alone; model names
resolve to one-line errors when they cannot be used; the environment names versions,
backend, device and mode.
"""

import shutil

import pytest
from tiny_models import build_model

from bi_rl.model import (
    Digests,
    ModelError,
    environment,
    model_digest,
    resolve_model,
    tokenizer_digest,
)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_model(tmp_path_factory.mktemp("model") / "m")


def test_digests_follow_their_files(model_dir, tmp_path):
    copy = tmp_path / "m"
    shutil.copytree(model_dir, copy)
    md, td = model_digest(copy), tokenizer_digest(copy)
    assert (md, td) == (model_digest(model_dir), tokenizer_digest(model_dir))
    (copy / "prompts.jsonl").write_text('{"prompt": "1+1="}\n')
    (copy / "README.md").write_text("notes")
    assert (model_digest(copy), tokenizer_digest(copy)) == (md, td)
    weights = copy / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1
    weights.write_bytes(bytes(data))
    assert model_digest(copy) != md and tokenizer_digest(copy) == td
    cfg = copy / "tokenizer_config.json"
    cfg.write_text(cfg.read_text() + " ")
    assert tokenizer_digest(copy) != td


def test_background_digests_equal_the_direct_ones(model_dir, tmp_path):
    d = Digests(model_dir)
    assert (d.model(), d.tokenizer()) == (model_digest(model_dir), tokenizer_digest(model_dir))
    with pytest.raises(FileNotFoundError):
        Digests(tmp_path / "gone").tokenizer()  # the thread's error reaches the caller


def test_model_names_resolve_or_fail_in_one_line(model_dir, tmp_path):
    assert resolve_model(str(model_dir)) == (model_dir, str(model_dir))
    (tmp_path / "empty").mkdir()
    (tmp_path / "f.txt").write_text("x")
    for name, match in [
        (str(tmp_path / "nope"), "no such directory"),
        (str(tmp_path / "empty"), "no config.json"),
        (str(tmp_path / "f.txt"), "is a file"),
    ]:
        with pytest.raises(ModelError, match=match) as e:
            resolve_model(name)
        assert "\n" not in str(e.value)


def test_environment_names_what_made_the_log():
    env = environment("some/model", "strict")
    assert env.model_path == "some/model" and env.invariant_mode == "strict"
    assert env.backend in ("cpu", "cuda", "metal")
    assert all(env.to_json()[k] for k in ("mlx", "mlx_lm", "bi_rl", "device", "python", "platform"))


def test_context_length_reads_the_config(tmp_path):
    """The context a model was configured for: max_position_embeddings, or the original
    length its RoPE scaling declares times its factor (the larger), else unknown."""
    import json

    from bi_rl.assets import DEFAULT_MODEL
    from bi_rl.model import context_length

    assert context_length(DEFAULT_MODEL) == 64
    cases = [
        ({"max_position_embeddings": 4096}, 4096),
        (
            {
                "max_position_embeddings": 32768,
                "rope_scaling": {
                    "type": "yarn",
                    "factor": 4.0,
                    "original_max_position_embeddings": 32768,
                },
            },
            131072,
        ),
        (
            {
                "max_position_embeddings": 131072,
                "rope_scaling": {
                    "rope_type": "llama3",
                    "factor": 8.0,
                    "original_max_position_embeddings": 8192,
                },
            },
            131072,
        ),
        ({"rope_scaling": {"type": "longrope", "original_max_position_embeddings": 4096}}, 4096),
        ({"text_config": {"max_position_embeddings": 8192}}, 8192),
        ({"rope_scaling": None}, None),
    ]
    for config, want in cases:
        (tmp_path / "config.json").write_text(json.dumps({"model_type": "x", **config}))
        assert context_length(tmp_path) == want, config
