"""A model's tokenizer read straight from its tokenizer.json with the `tokenizers` library.

mlx-lm loads tokenizers through transformers, whose import (and, where it is installed,
torch's) costs seconds at every start. For a directory without a chat template whose
tokenizer_config.json adds nothing to tokenizer.json but the names of its special tokens,
`FastTokenizer.open` reads tokenizer.json itself:
  - encode(text) = tokenizer.json's encoding with its special tokens added (the directory
    is refused where tokenizer_config's add_bos_token / add_eos_token ask for other
    tokens around a text than tokenizer.json adds, or name a special token tokenizer.json
    lacks: transformers would change the tokenizer there);
  - decode(ids) = tokenizer.json's decoding, special tokens kept, with transformers'
    clean-up of spaces where tokenizer_config asks for it (never for BPE, as transformers);
  - eos_token_ids = config.json's eos_token_id(s) (generation_config.json's where it has
    them) and the tokenizer's eos token, as mlx-lm's TokenizerWrapper.
A chat template, a specific tokenizer class (anything but "PreTrainedTokenizerFast" or
"TokenizersBackend") or any other tokenizer_config entry makes `open` return None, and the
model loads through mlx-lm; BI_RL_LOADER=mlx-lm (bi_rl.model.load) always does.

tokenizer.json is the tokenizer as the model's authors saved it, and for released models
transformers runs the same pipeline. transformers 5 can differ: it may rebuild a tokenizer
from its vocabulary with the pipeline of the model's family (config.json's model_type),
dropping what that pipeline cannot map (a character-level tokenizer saved under model type
qwen2 loses its spaces there, kept here). A log records the prompt tokens it was made
from, so rescoring and audit never depend on which reading made them.

Any attribute FastTokenizer does not define is answered by mlx-lm's own tokenizer, loaded
(with transformers) on that first use.
"""

from __future__ import annotations

import json
from pathlib import Path

__all__ = ["FastTokenizer"]

GENERIC_CLASSES = ("PreTrainedTokenizerFast", "TokenizersBackend")
SPECIAL_KEYS = ("bos_token", "eos_token", "unk_token", "pad_token")
# tokenizer_config.json entries whose effect FastTokenizer reproduces or which do not touch
# encoding or decoding; any other entry sends the directory to transformers.
KNOWN_KEYS = {
    *SPECIAL_KEYS,
    "add_bos_token",
    "add_eos_token",
    "added_tokens_decoder",
    "additional_special_tokens",
    "extra_special_tokens",
    "backend",
    "clean_up_tokenization_spaces",
    "model_input_names",
    "model_max_length",
    "padding_side",
    "truncation_side",
    "split_special_tokens",
    "tokenizer_class",
}


def _content(token) -> str | None:
    return token.get("content") if isinstance(token, dict) else token


def _clean_up(text: str) -> str:
    """transformers' clean_up_tokenization."""
    for a, b in (
        (" .", "."),
        (" ?", "?"),
        (" !", "!"),
        (" ,", ","),
        (" ' ", "'"),
        (" n't", "n't"),
        (" 'm", "'m"),
        (" 's", "'s"),
        (" 've", "'ve"),
        (" 're", "'re"),
    ):
        text = text.replace(a, b)
    return text


class FastTokenizer:
    """encode / decode / eos_token_ids of a model directory's tokenizer.json (module doc)."""

    has_chat_template = False

    def __init__(self, path: Path, tokenizer, specials: dict, eos_ids: set, clean_up: bool):
        self.path = path
        self._tok = tokenizer
        self._specials = specials  # "bos_token" -> id, ...
        self.eos_token_ids = eos_ids
        self._clean_up = clean_up
        self._full = None

    @classmethod
    def open(cls, path: Path, config: dict) -> FastTokenizer | None:
        """The tokenizer of `path` (config: its config.json), or None (module doc)."""
        path = Path(path)
        if not (path / "tokenizer.json").is_file():
            return None
        if any((path / n).exists() for n in ("chat_template.jinja", "chat_template.json")):
            return None
        try:
            tc_file = path / "tokenizer_config.json"
            tc = json.loads(tc_file.read_text(encoding="utf-8")) if tc_file.is_file() else {}
        except (OSError, UnicodeDecodeError, json.JSONDecodeError):
            return None
        if (
            not isinstance(tc, dict)
            or set(tc) - KNOWN_KEYS
            or tc.get("tokenizer_class") not in GENERIC_CLASSES
            or tc.get("split_special_tokens")
        ):
            return None
        from tokenizers import Tokenizer

        try:
            tok = Tokenizer.from_file(str(path / "tokenizer.json"))
        except Exception:
            return None
        added = {t.content: i for i, t in tok.get_added_tokens_decoder().items() if t.special}
        wanted = [_content(tc.get(k)) for k in SPECIAL_KEYS]
        for k in ("additional_special_tokens", "extra_special_tokens"):
            wanted += [_content(t) for t in tc.get(k) or ()]
        wanted += [_content(t) for t in (tc.get("added_tokens_decoder") or {}).values()]
        if any(w is not None and w not in added for w in wanted):
            return None  # transformers would add it to the vocabulary
        specials = {k: added[_content(tc[k])] for k in SPECIAL_KEYS if _content(tc.get(k))}
        if not _same_post_processor(tok, tc, specials):
            return None
        clean_up = bool(tc.get("clean_up_tokenization_spaces", False))
        clean_up = clean_up and type(tok.model).__name__ != "BPE"
        eos = config.get("eos_token_id")
        eos_ids = set(eos if isinstance(eos, list) else [] if eos is None else [eos])
        if "eos_token" in specials:
            eos_ids.add(specials["eos_token"])
        return cls(path, tok, specials, eos_ids, clean_up)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self._tok.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        text = self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens)
        return _clean_up(text) if self._clean_up else text

    @property
    def eos_token_id(self) -> int | None:
        return self._specials.get("eos_token")

    @property
    def bos_token_id(self) -> int | None:
        return self._specials.get("bos_token")

    @property
    def pad_token_id(self) -> int | None:
        return self._specials.get("pad_token")

    @property
    def unk_token_id(self) -> int | None:
        return self._specials.get("unk_token")

    def __len__(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    def __getattr__(self, attr):
        # Anything else (a streaming detokenizer, the vocabulary, ...) from mlx-lm's own
        # tokenizer for this directory, loaded (with transformers) on the first such use.
        if attr.startswith("_"):
            raise AttributeError(attr)
        if self._full is None:
            from mlx_lm.tokenizer_utils import load

            self._full = load(self.path, eos_token_ids=sorted(self.eos_token_ids))
        return getattr(self._full, attr)


def _same_post_processor(tok, tc: dict, specials: dict) -> bool:
    """Whether transformers keeps what tokenizer.json adds around a text: it rebuilds the
    post-processor (bos and eos per add_bos_token / add_eos_token) when tokenizer_config sets
    either flag or tokenizer.json has none; then it must add exactly those tokens."""
    if "add_bos_token" not in tc and "add_eos_token" not in tc and tok.post_processor is not None:
        return True
    probe = "0"
    inner = tok.encode(probe, add_special_tokens=False).ids
    outer = tok.encode(probe, add_special_tokens=True).ids
    bos = [specials["bos_token"]] if tc.get("add_bos_token") and "bos_token" in specials else []
    eos = [specials["eos_token"]] if tc.get("add_eos_token") and "eos_token" in specials else []
    return outer == bos + inner + eos
