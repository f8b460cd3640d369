"""Example reward functions for bi-train (--reward examples/rewards.py:NAME).

bi-train calls a reward function with those of prompt=, completion=, finish=, row= and
tokens= it names, once per sample, and wants a finite number back (bi_rl/train/rewards.py).

    bi-train --model DIR --prompts FILE --reward examples/rewards.py:even_tokens
"""

from __future__ import annotations


def even_tokens(tokens: list[int]) -> float:
    """The share of completion tokens with an even id: a signal any model, even one with
    random weights and a tokenizer smaller than its vocabulary, can learn to raise."""
    return sum(t % 2 == 0 for t in tokens) / len(tokens) if tokens else 0.0


def exact_answer(completion: str, finish: str, row: dict) -> float:
    """1 when the completion is the prompt row's "answer" and generation stopped, else 0."""
    return float(finish == "stop" and completion.strip() == str(row.get("answer", "")).strip())
