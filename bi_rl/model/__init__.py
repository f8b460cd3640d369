"""The model a run uses: where it is, how it loads, what identifies it, and where it ran.

`resolve_model` turns a path, a hub id or None (the embedded default) into a local directory
and the name a log records; `load_model` loads it (bi_rl.model.load, else mlx-lm);
`context_length` reads the context its config declares; `model_digest` and
`tokenizer_digest` are what a log's header records so that rescoring and audit can refuse
another model, and `Digests` computes both in background threads while the model loads and
runs; `environment` names the package versions, backend, device and invariant mode a run
had. Rollout, rescoring, audit and the CLIs all take these from here.

What the digests cover, read in full on every call (never trusted from file times):
  model      blake2b-128 (personalisation "bi-rl/model") over config.json and every
             *.safetensors file of the directory, in file-name order, each as
             orjson([name, size]) followed by its bytes;
  tokenizer  the same over the tokenizer files (tokenizer*, special_tokens_map.json,
             added_tokens.json, vocab.*, merges.txt, chat_template.*, *.tiktoken), with
             personalisation "bi-rl/tokenizer".
Other files (README, generation_config.json, prompts) are not covered.

Every problem a user can cause (a missing directory, a file where a directory belongs, a
model mlx-lm cannot load) raises ModelError with a one-line message.

    load.py       loading without mlx-lm's tokenizer stack, where that gives the same model
    tokenizer.py  a tokenizer.json read with the `tokenizers` library
    kernels.py    the Hopper GEMM kernels a model needs, compiled ahead on a first run
"""

from __future__ import annotations

import hashlib
import os
import platform
import re
import sys
import threading
from dataclasses import asdict, dataclass
from pathlib import Path

import orjson

__all__ = [
    "Digests",
    "Environment",
    "ModelError",
    "context_length",
    "environment",
    "load_model",
    "model_digest",
    "resolve_model",
    "tokenizer_digest",
]

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
_TOKENIZER_FILES = re.compile(
    r"^(tokenizer.*|special_tokens_map\.json|added_tokens\.json|vocab\..*|merges\.txt"
    r"|chat_template\..*|.*\.tiktoken)$"
)


class ModelError(RuntimeError):
    """A model that cannot be found, loaded or used; the message is one line naming why."""


def _digest_files(files: list[Path], person: bytes) -> str:
    h = hashlib.blake2b(digest_size=16, person=person)
    for f in sorted(files, key=lambda p: p.name):
        h.update(orjson.dumps([f.name, f.stat().st_size]))
        with open(f, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()


def model_digest(path) -> str:
    """blake2b-128 over config.json and the *.safetensors weight files (name, size, bytes)."""
    path = Path(path)
    files = [path / "config.json", *path.glob("*.safetensors")]
    return _digest_files([f for f in files if f.is_file()], b"bi-rl/model")


def tokenizer_digest(path) -> str:
    """blake2b-128 over the tokenizer files (tokenizer*, vocab, merges, chat template...)."""
    files = [f for f in Path(path).iterdir() if f.is_file() and _TOKENIZER_FILES.match(f.name)]
    return _digest_files(files, b"bi-rl/tokenizer")


class Digests:
    """`model_digest` and `tokenizer_digest` of a directory, each hashed in its own thread
    from construction on (hashlib releases the GIL while it hashes), so that reading the
    weights overlaps loading the model and the first generation steps. `model()` and
    `tokenizer()` wait for their result (or raise what hashing raised)."""

    def __init__(self, path):
        self._results: dict[str, object] = {}
        self._threads = [
            threading.Thread(target=self._run, args=(k, fn, Path(path)), daemon=True)
            for k, fn in (("model", model_digest), ("tokenizer", tokenizer_digest))
        ]
        for t in self._threads:
            t.start()

    def _run(self, kind, fn, path) -> None:
        try:
            self._results[kind] = fn(path)
        except BaseException as e:  # re-raised by the caller's thread
            self._results[kind] = e

    def _get(self, i: int, kind: str) -> str:
        self._threads[i].join()
        r = self._results[kind]
        if isinstance(r, BaseException):
            raise r
        return r

    def model(self) -> str:
        return self._get(0, "model")

    def tokenizer(self) -> str:
        return self._get(1, "tokenizer")


def _reason(e: Exception) -> str:
    return str(e).splitlines()[0] if str(e) else type(e).__name__


def resolve_model(model: str | None) -> tuple[Path, str]:
    """(local directory, name recorded in the header) for a path, a hub id or None."""
    if model is None:
        try:
            from bi_rl.assets import DEFAULT_MODEL
        except ImportError:
            raise ModelError(
                "no --model given and no embedded default model is installed"
            ) from None
        return Path(DEFAULT_MODEL), f"embedded:{Path(DEFAULT_MODEL).name}"
    path = Path(model).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelError(f"model {model!r}: directory has no config.json (not an mlx-lm model)")
        return path, model
    if path.exists():
        raise ModelError(f"model {model!r} is a file; pass an mlx-lm model directory")
    if not _HUB_ID.match(model):
        raise ModelError(f"model {model!r}: no such directory")
    try:
        from mlx_lm.utils import _download

        return Path(_download(model)), model
    except Exception as e:
        raise ModelError(
            f"model {model!r} is not a local directory and could not be fetched from the hub "
            f"({_reason(e)})"
        ) from None


def load_model(path: Path):
    """(model, tokenizer) of a local directory, its failures turned into one-line errors.

    Directories bi_rl.model.load can read load without importing mlx-lm's tokenizer stack
    (the same model, bit for bit, and the same tokens); the rest through mlx_lm.load.
    """
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    from bi_rl.model.load import direct_load

    try:
        loaded = direct_load(path)
        if loaded is not None:
            return loaded
        import mlx_lm

        return mlx_lm.load(str(path))
    except Exception as e:
        raise ModelError(f"cannot load model {str(path)!r}: {_reason(e)}") from None


def context_length(path) -> int | None:
    """The number of positions the model at `path` was configured for, or None if unknown.

    config.json's max_position_embeddings (in text_config for multimodal configs), or, where
    its RoPE scaling declares an original length, that length times the scaling factor when
    larger (YaRN and similar configs keep the pre-scaling length in max_position_embeddings).
    RoPE itself runs at any position: this is what the model was trained or scaled for.
    """
    try:
        config = orjson.loads((Path(path) / "config.json").read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return None
    if not isinstance(config, dict):
        return None
    if isinstance(config.get("text_config"), dict):
        config = {**config, **config["text_config"]}
    found = []
    if _positive_int(config.get("max_position_embeddings")):
        found.append(config["max_position_embeddings"])
    scaling = config.get("rope_scaling")
    if isinstance(scaling, dict) and _positive_int(scaling.get("original_max_position_embeddings")):
        original = scaling["original_max_position_embeddings"]
        factor = scaling.get("factor")
        scaled = isinstance(factor, int | float) and factor > 1
        found.append(int(original * factor) if scaled else original)
    return max(found) if found else None


def _positive_int(x) -> bool:
    return type(x) is int and x > 0


@dataclass(frozen=True)
class Environment:
    """Where and with what a run was made: a log header's env section (outside the hash
    chain, so logs from two machines with bitwise-equal samples have equal hashes)."""

    model_path: str  # the model's name as given: a path, a hub id, or embedded:<name>
    bi_rl: str
    mlx: str
    mlx_lm: str | None
    python: str
    platform: str
    backend: str  # the bi_rl backend that served the invariant ops
    device: str
    invariant_mode: str  # strict, fallback or off (bi_rl.mode.MODES)
    # keys a split of the CUDA attention kernels (bi_rl._split): each size gives other bits;
    # None (and absent from the JSON) on backends without splits and in logs older than it
    attention_split: int | None = None

    def to_json(self) -> dict:
        env = asdict(self)
        if env["attention_split"] is None:
            del env["attention_split"]
        return env


def environment(model_name: str, mode: str) -> Environment:
    """This process's environment for a run of `model_name` in run mode `mode`."""
    from importlib.metadata import PackageNotFoundError, version

    import mlx.core as mx

    import bi_rl
    from bi_rl._split import split_keys
    from bi_rl.backends import active, device_name

    try:
        mlx_lm = version("mlx-lm")
    except PackageNotFoundError:
        mlx_lm = None
    backend = active().name
    return Environment(
        model_path=model_name,
        bi_rl=bi_rl.__version__,
        mlx=mx.__version__,
        mlx_lm=mlx_lm,
        python=platform.python_version(),
        platform=f"{sys.platform}-{platform.machine()}",
        backend=backend,
        device=device_name(),
        invariant_mode=mode,
        attention_split=split_keys() if backend == "cuda" else None,
    )
