"""bi-verify --warmup: compile every kernel a model will need, before its first real run.

    bi-verify --warmup                       # the embedded default
    bi-verify --warmup --model DIR --batch-size 64 --prefill-chunk 512

A fresh GPU compiles kernels at their first use and caches them on disk: bi-rl's Hopper GEMMs
(NVRTC, bi_rl.model.kernels lists and compiles them ahead, counted) and the kernels MLX
compiles itself at a first call (attention, the mma.sync GEMMs of other GPUs, fused
element-wise graphs such as the sampler's noise and the row fingerprint). For the second
kind `warm_up` runs the model: rollouts of synthetic prompts (a full prefill chunk, so
attention runs long rows, and shorter ones, so rows are padded) at 1, 4, 16 and
`batch_size` rows, two tokens each, and a rescoring of what they made, in the mode given.
On the CPU nothing needs compiling ahead but MLX's compiled element-wise graphs, which the
same runs build.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import mlx.core as mx

from bi_rl.model.kernels import prepare_kernels
from bi_rl.rollout.engine import Engine, EngineConfig
from bi_rl.rollout.prompts import Prompt
from bi_rl.rollout.sampler import SamplerConfig
from bi_rl.score.scorer import Item, ScoreConfig, score

__all__ = ["warm_up"]


def _prompts(count: int, longest: int, vocab: int, key: int) -> list[Prompt]:
    """`count` prompts of random tokens, the first `longest` long, the others shorter."""
    lengths = [max(1, longest - (i * longest) // max(count, 1)) for i in range(count)]
    ids = mx.random.randint(0, vocab, (count, longest), key=mx.random.key(key)).tolist()
    return [Prompt(f"warmup-{i}", tuple(ids[i][:n])) for i, n in enumerate(lengths)]


def warm_up(
    model,
    *,
    batch_size: int,
    prefill_chunk: int,
    mode: str = "strict",
    say: Callable[[str], None] = print,
) -> dict:
    """Compile what `model` needs at up to `batch_size` rows and `prefill_chunk`-token
    prefill chunks (module doc); returns what it did and how long it took."""
    t0 = time.perf_counter()
    compiled = prepare_kernels(model, batch_size * prefill_chunk, say) if mode != "off" else 0
    t1 = time.perf_counter()
    vocab = model.args.vocab_size
    sizes = sorted({b for b in (1, 4, 16) if b < batch_size} | {batch_size})
    for b in sizes:
        prompts = _prompts(b, prefill_chunk + 1, vocab, key=b)
        config = EngineConfig(
            max_tokens=2,
            stop_tokens=(),
            batch_size=b,
            prefill_chunk=prefill_chunk,
            mode=mode,
        )
        engine = Engine(model, None, SamplerConfig(seed=0), config)
        samples = [s for step in engine.generate(prompts) for s in step.ready]
        items = [Item(s.prompt_tokens, tuple(s.tokens)) for s in samples]
        score(model, items, ScoreConfig(batch_size=b, mode=mode))
        say(f"ran {b} row{'s' if b > 1 else ''}: prefill, decode and rescoring")
    return {
        "hopper_kernels_compiled": compiled,
        "compile_seconds": round(t1 - t0, 3),
        "batch_sizes": sizes,
        "prefill_chunk": prefill_chunk,
        "mode": mode,
        "seconds": round(time.perf_counter() - t0, 3),
    }
