"""Multi-digit addition: the embedded default task, its tokenizer and its reward.

A problem is two non-negative integers of up to ``max_digits`` digits, written at a fixed
width: operands zero-padded to ``max_digits`` digits and the sum to ``max_digits + 1``. For
``12 + 345 = 357`` the prompt is ``"012+345="`` and the answer ``"0357"``; the model must
follow it with its end-of-sequence token. At a fixed width the operand digits of a place
sit at the same distance from the answer digit of that place in every problem, which a
tiny model learns far faster than the free format ("12+345=" -> "357"), where those
distances change with the operands' lengths (bi_rl/assets/tiny-adder/README.md has the
measurements).

Everything here is a pure function of its arguments: problem ``i`` of seed ``s`` is the
same on every machine, in every process, whatever was generated before it (a
counter-based hash of (seed, index), never a global random generator).

Train and held-out problems never share an operand pair: a pair belongs to the held-out
split when a fixed hash of the unordered pair falls in one bucket of ``HELDOUT_BUCKETS``,
so ``12+345`` and ``345+12`` are held out together and a model trained on ``split="train"``
has seen neither.

The tokenizer is character level (one token per digit, ``+`` and ``=``, plus four special
tokens), so any string over the alphabet encodes to exactly one token per character and
decoding then re-encoding never changes a token.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

# --- problems -------------------------------------------------------------------------------

_MASK64 = (1 << 64) - 1
# Salt of the split hash: fixed forever, or the held-out set would move.
_SPLIT_SALT = 0x5EED_AD0E_2024
HELDOUT_BUCKETS = 8  # one pair in eight is held out
SPLITS = ("train", "heldout", "all")


def _splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def hash_words(*words: int) -> int:
    """A 64-bit hash of a sequence of integers (splitmix64 folded over the words)."""
    h = 0
    for w in words:
        h = _splitmix64(h ^ (w & _MASK64))
    return h


def is_heldout(a: int, b: int) -> bool:
    """Whether the unordered operand pair {a, b} belongs to the held-out split."""
    lo, hi = min(a, b), max(a, b)
    return hash_words(_SPLIT_SALT, lo, hi) % HELDOUT_BUCKETS == 0


@dataclass(frozen=True)
class Problem:
    """``a + b`` with operands of at most ``width`` digits."""

    a: int
    b: int
    width: int

    @property
    def prompt(self) -> str:
        return f"{self.a:0{self.width}d}+{self.b:0{self.width}d}="

    @property
    def answer(self) -> str:
        return f"{self.a + self.b:0{self.width + 1}d}"


@dataclass(frozen=True)
class AdditionTask:
    """Problems with operands of ``min_digits`` to ``max_digits`` digits each, written at the
    width ``max_digits``.

    The digit count of each operand is drawn uniformly, then the operand uniformly among
    numbers with that many digits (0 counts as a one-digit number), so short and long
    operands are equally common.
    """

    min_digits: int = 1
    max_digits: int = 3
    split: str = "train"

    def __post_init__(self):
        if not 1 <= self.min_digits <= self.max_digits <= 15:  # the hash has 56 spare bits
            raise ValueError(
                f"need 1 <= min_digits <= max_digits <= 15, got {self.min_digits}, "
                f"{self.max_digits}"
            )
        if self.split not in SPLITS:
            raise ValueError(f"unknown split {self.split!r}: choose one of {SPLITS}")

    def _operand(self, h: int) -> int:
        span = self.max_digits - self.min_digits + 1
        digits = self.min_digits + (h % span)
        lo = 0 if digits == 1 else 10 ** (digits - 1)
        hi = 10**digits
        return lo + (h >> 8) % (hi - lo)

    def problem(self, seed: int, index: int) -> Problem:
        """Problem ``index`` of the stream ``seed``: a pure function of both."""
        if index < 0:
            raise ValueError(f"problem index must be >= 0, got {index}")
        attempt = 0
        while True:
            a = self._operand(hash_words(seed, index, attempt, 0))
            b = self._operand(hash_words(seed, index, attempt, 1))
            if self.split == "all" or is_heldout(a, b) == (self.split == "heldout"):
                return Problem(a, b, self.max_digits)
            attempt += 1

    def problems(self, seed: int, start: int, count: int) -> list[Problem]:
        return [self.problem(seed, i) for i in range(start, start + count)]


def parse_problem(prompt: str) -> Problem | None:
    """The problem a prompt states ("012+345=" -> Problem(12, 345, 3)), or None unless the
    prompt is exactly two operands of the same width, "+" and "="."""
    a, plus, rest = prompt.partition("+")
    b, eq, tail = rest.partition("=")
    if not (plus and eq and not tail and len(a) == len(b) and 1 <= len(a) <= 15):
        return None
    if not (a.isascii() and a.isdigit() and b.isascii() and b.isdigit()):
        return None
    return Problem(int(a), int(b), len(a))


# --- answers and rewards -----------------------------------------------------------------------

# A completion ends properly when generation stopped on the end-of-sequence token, which the
# rollout log records as finish reason "stop"; "length" means it ran out of tokens.
STOPPED = "stop"


def parse_answer(completion: str, digits: int) -> int | None:
    """The sum a completion states, or None unless it is exactly ``digits`` ASCII digits.

    The completion is the generated text without the end-of-sequence token ("0357" states
    357 when the answer has four digits).
    """
    if len(completion) != digits or not completion.isascii() or not completion.isdigit():
        return None
    return int(completion)


def reward(answer: str, completion: str, finish_reason: str) -> float:
    """1.0 for exactly the right answer followed by end-of-sequence, else 0.0."""
    return 1.0 if finish_reason == STOPPED and completion == answer else 0.0


def partial_reward(answer: str, completion: str, finish_reason: str) -> float:
    """A shaped reward for GRPO on a weak model: exact answers still earn 1.0.

    A wrong but properly terminated answer of the right length earns ``0.5 * d / n``, where
    ``d`` counts its digits equal to the answer's digit in the same place and ``n`` is the
    answer's length. Anything else earns 0.0, so the shaped part stays below any exact
    answer's reward and a malformed answer never beats a well-formed wrong one.
    """
    if reward(answer, completion, finish_reason) == 1.0:
        return 1.0
    if finish_reason != STOPPED or parse_answer(completion, len(answer)) is None:
        return 0.0
    same = sum(x == y for x, y in zip(answer, completion, strict=True))
    return 0.5 * same / len(answer)


# --- tokenizer --------------------------------------------------------------------------------

PAD, BOS, EOS, UNK = "<pad>", "<bos>", "<eos>", "<unk>"
SPECIAL_TOKENS = (PAD, BOS, EOS, UNK)  # ids 0..3, in this order
ALPHABET = "0123456789+="  # ids 4..15, in this order
VOCAB = {tok: i for i, tok in enumerate((*SPECIAL_TOKENS, *ALPHABET))}
PAD_ID, BOS_ID, EOS_ID, UNK_ID = (VOCAB[t] for t in SPECIAL_TOKENS)


def build_tokenizer():
    """The character-level `tokenizers.Tokenizer` of the task.

    Each character is one token (unknown characters become <unk>); encoding prepends <bos>
    (skip it with ``add_special_tokens=False``); decoding concatenates the tokens' text.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors

    tok = Tokenizer(models.WordLevel(vocab=dict(VOCAB), unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A $B:1", special_tokens=[(BOS, BOS_ID)]
    )
    tok.add_special_tokens(list(SPECIAL_TOKENS))
    return tok


def tokenizer_config() -> dict:
    """tokenizer_config.json for transformers / mlx-lm. No chat template: prompts are raw."""
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS,
        "eos_token": EOS,
        "pad_token": PAD,
        "unk_token": UNK,
        "add_bos_token": True,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 64,
    }


def save_tokenizer(directory: str | Path) -> None:
    """Write tokenizer.json and tokenizer_config.json, loadable offline by mlx_lm.load."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    build_tokenizer().save(str(directory / "tokenizer.json"))
    with open(directory / "tokenizer_config.json", "w") as f:
        json.dump(tokenizer_config(), f, indent=2, sort_keys=True)
        f.write("\n")


_ID_TO_TOKEN = {i: tok for tok, i in VOCAB.items()}


def encode(text: str, bos: bool = True) -> list[int]:
    """Token ids of ``text`` without loading a tokenizer (same ids as build_tokenizer())."""
    ids = [VOCAB.get(ch, UNK_ID) for ch in text]
    return [BOS_ID, *ids] if bos else ids


def decode(ids: list[int]) -> tuple[str, bool]:
    """(text, stopped) of generated ids: the text before the first <eos>, and whether an
    <eos> came. Other special tokens and out-of-vocabulary ids decode to ``[<name>]`` /
    ``[id]``, which no answer parses as a number."""
    text = []
    for i in ids:
        if i == EOS_ID:
            return "".join(text), True
        tok = _ID_TO_TOKEN.get(i)
        text.append(f"[{tok}]" if tok in SPECIAL_TOKENS else tok if tok else f"[{i}]")
    return "".join(text), False
