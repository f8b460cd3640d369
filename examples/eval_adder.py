"""Held-out greedy accuracy of the embedded adder, with or without bi-train's adapters.

    PYTHONPATH=. python examples/eval_adder.py                       # the embedded model
    PYTHONPATH=. python examples/eval_adder.py --adapter-path adapters   # after bi-train

Loads the model with mlx-lm (`mlx_lm.load(..., adapter_path=)` reads bi-train's
checkpoints), generates greedily with `bi_rl.batch_generate` (mlx-lm's call, the invariant
engine) and counts exact answers on held-out problems: operand pairs the train split, which
bi-train samples from, never contains.
"""

from __future__ import annotations

import argparse

import mlx_lm

import bi_rl
from bi_rl.assets import DEFAULT_MODEL
from bi_rl.tasks.addition import AdditionTask

EVAL_SEED = 7_000_003  # the held-out stream examples/grpo.py evaluates on


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--adapter-path", help="bi-train's checkpoint directory")
    p.add_argument("--size", type=int, default=256, help="held-out problems (default 256)")
    args = p.parse_args(argv)
    model, tok = mlx_lm.load(str(DEFAULT_MODEL), adapter_path=args.adapter_path)
    problems = AdditionTask(split="heldout").problems(EVAL_SEED, 0, args.size)
    r = bi_rl.batch_generate(model, tok, [tok.encode(q.prompt) for q in problems], max_tokens=6)
    # The texts leave out the stop token (mlx-lm's rule). A text equal to the 4-digit answer
    # must have stopped: without <eos> it would run to 6 tokens.
    exact = sum(text == q.answer for q, text in zip(problems, r.texts, strict=True))
    with_ = f" with {args.adapter_path}" if args.adapter_path else ""
    print(
        f"held-out greedy accuracy {exact / len(problems):.3f} ({exact} of {len(problems)}){with_}"
    )


if __name__ == "__main__":
    main()
