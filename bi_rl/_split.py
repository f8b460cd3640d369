"""The attention kernels' split size, read from the environment (no GPU module imported).

Keys a split reduces before its result is folded into the row's (kernels/cuda/
attention_common.cuh and hopper/attention.cu): 512 unless BI_RL_ATTN_SPLIT names another of
SPLIT_SIZES. A longer split folds less often in prefill and leaves decode's combine fewer
partials; on an H100, 512 took less time than 256 in nearly every attention shape measured
(BENCHMARK.md). Each size gives other bits on CUDA, so a log is rescored bit for bit only at
the size it was made with: the size is recorded in a log's header (bi_rl.model.Environment)
and bi-rescore notes a difference. Every attention kernel of a process takes the same size
(an attention plan reads it once, for both of its kernels), so decode and prefill agree at
every size. Here, not in the CUDA backend, so that the commands can refuse a bad value at
start without importing the backend (bi_rl.cli.settings_refused).
"""

import os

KEYS_PER_SPLIT = 512
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
