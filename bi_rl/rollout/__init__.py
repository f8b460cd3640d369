"""Rollouts: the keyed sampler, the continuous-batching engine, the hash-chained log.

    sampler.py   a row's token = f(logits, seed, prompt id, sample, position)
    engine.py    continuous batching over mlx-lm models inside batch_invariant_mode
    log.py       the log format, writer, reader and hash chain (spec in its docstring)
    prompts.py   prompt files and datasets -> token ids (chat template when present)
    run.py       one bi-rollout run end to end

The logits -> logprob / fingerprint step the scorer shares lives in bi_rl.logprobs.
"""

from bi_rl.rollout.engine import Engine, EngineConfig, Prompt, Sample
from bi_rl.rollout.log import LogError, LogRecord, LogWriter, iter_records, read_header, read_log
from bi_rl.rollout.sampler import SamplerConfig

__all__ = [
    "Engine",
    "EngineConfig",
    "LogError",
    "LogRecord",
    "LogWriter",
    "Prompt",
    "Sample",
    "SamplerConfig",
    "iter_records",
    "read_header",
    "read_log",
]
