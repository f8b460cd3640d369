"""The attention kernels' split size, read from the environment (no GPU module imported).

Keys a split reduces before its result is folded into the row's (kernels/cuda/
attention_common.cuh and hopper/attention.cu): 256 unless BI_RL_ATTN_SPLIT names another of
SPLIT_SIZES, an experiment for timing against 256, not for rollouts. A longer split folds
less often in prefill and leaves decode's combine fewer partials, and gives other bits on
CUDA. Every attention kernel of a process takes the same size (an attention plan reads it
once, for both of its kernels); the two prefill kernels agree bit for bit at 512 and 1024,
and the attention GPU tests (decode against prefill, chunked prefill) pass at 512 as well,
but the rest of the GPU suite (golden logs, engine and scorer) has run only at 256, so only
256 carries the guarantee (BENCHMARK.md). Here, not in the CUDA backend, so that the
commands can refuse a bad value at start without importing the backend
(bi_rl.cli.settings_refused).
"""

import os

KEYS_PER_SPLIT = 256
SPLIT_ENV = "BI_RL_ATTN_SPLIT"
SPLIT_SIZES = (256, 512, 1024)


def split_keys() -> int:
    """Keys per split for this process's attention kernels; ValueError naming the variable
    for a value outside SPLIT_SIZES."""
    value = os.environ.get(SPLIT_ENV, "")
    if value == "":
        return KEYS_PER_SPLIT
    if value not in {str(s) for s in SPLIT_SIZES}:
        sizes = ", ".join(str(s) for s in SPLIT_SIZES)
        raise ValueError(f"{SPLIT_ENV} must be one of {sizes} (or unset), got {value!r}")
    return int(value)
