"""Rollouts: the keyed sampler, the continuous-batching engine, the hash-chained log.

    sampler.py   a row's token = f(logits, seed, prompt id, sample, position)
    prompts.py   prompt files and datasets -> token ids (chat template when present)
    engine.py    continuous batching over mlx-lm models inside batch_invariant_mode, pipelined
    batch.py     the decode batch: KV caches, rows joining and leaving, host-side bookkeeping
    schema.py    the log format: typed header, record schema, hash chain, sidecar, version
    log.py       writing (optionally from a thread of its own), reading, verifying, resuming
    run.py       one bi-rollout run end to end
    paths.py     output paths checked before a command works: never over what it reads or a log
    generate.py  mlx-lm's batch_generate call on this engine (bi_rl.batch_generate)

The logits -> logprob / fingerprint step the scorer shares lives in bi_rl.logprobs; the
model's loading and provenance in bi_rl.model.
"""

from bi_rl.rollout.engine import Engine, EngineConfig, Sample
from bi_rl.rollout.log import LogWriter, iter_records, read_header, read_log
from bi_rl.rollout.prompts import Prompt
from bi_rl.rollout.sampler import SamplerConfig
from bi_rl.rollout.schema import LogError, LogRecord, RunHeader, RunSettings, Sidecar

__all__ = [
    "Engine",
    "EngineConfig",
    "LogError",
    "LogRecord",
    "LogWriter",
    "Prompt",
    "RunHeader",
    "RunSettings",
    "Sample",
    "SamplerConfig",
    "Sidecar",
    "iter_records",
    "read_header",
    "read_log",
]
