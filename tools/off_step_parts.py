"""Where stock MLX's decode step goes when rows are padded: the bare step of `--mode off`
with its attention masked, as the engine runs it, against the same step with the mask
dropped (a timing counterfactual: padded rows then attend to their padding keys, so its
tokens are not a rollout's), on bi-bench's end-to-end workload.

    PYTHONPATH=. python tools/off_step_parts.py [--workload qwen3-1.7b] [--model-dir DIR] \
        [--models bf16] [--batches 1,8,64] [--steps 64] [--repeats 3] [--json out.json]

With one query a row, stock MLX's CUDA attention runs one fused kernel only without an array
mask; with the boolean mask that left padding needs it composes the attention from a
matmul, a select, a softmax and a second matmul (mlx/fast.cpp's fallback). In a pipelined
step the host builds the graph (`build`), queues it (`submit`: MLX's eval loop encodes every
kernel into CUDA graphs and launches them) and waits for the previous step (`wait`); the
tool prints each phase for both arms, so the masked attention's cost shows up in the phase
that pays it. Run it once with MLX_USE_CUDA_GRAPHS=0 beside the default to see how much of
`submit` is graph instantiation rather than kernel launches.

Both arms run the same model, prompts and cache; only `make_mask` of the engine's full-
attention cache differs. At batch 1 no row is padded and the engine drops the mask itself,
so the two arms must agree there (a guard that the arms differ only in the mask: their
logits are compared bitwise at every batch and reported, equal at B = 1, differing where
rows are padded).
"""

from __future__ import annotations

import argparse
import os
import sys
from contextlib import contextmanager, nullcontext
from pathlib import Path
from unittest.mock import patch

import mlx.core as mx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # concat_ab, beside this script
from concat_ab import (  # noqa: E402
    alternated,
    arm_medians,
    each_batch,
    workload_args,
    workload_parser,
    write_rows,
)


@contextmanager
def mask_dropped():
    """Every full-attention cache of the engine builds no mask for one query a row."""
    from bi_rl.rollout.caches import EngineBatchKVCache

    original = EngineBatchKVCache.make_mask

    def make_mask(self, N: int, return_array: bool = False, window_size=None, **kwargs):
        if N == 1 and window_size is None:
            return None
        return original(self, N, return_array=return_array, window_size=window_size, **kwargs)

    with patch.object(EngineBatchKVCache, "make_mask", make_mask):
        yield


ARMS = {"masked": nullcontext, "no_mask": mask_dropped}


def first_logits(model, prompts) -> np.ndarray:
    """The first decode step's logits after prefilling `prompts` in mode off, as bits."""
    from bi_rl.bench import e2e
    from bi_rl.mode import named_mode

    batch = e2e.prefilled(model, prompts, "off")
    with named_mode("off"):
        logits = model(batch.y[:, None], cache=batch.caches)[:, -1, :]
        mx.eval(logits)
    return np.array(logits.astype(mx.float32)).view(np.uint32)


def time_batch(model, prompts, steps: int, repeats: int) -> dict:
    """Median bare-step phases (ms) of each arm, the order rotated between repeats."""
    from bi_rl.bench import e2e

    def side(name: str, warm: bool) -> dict:
        with ARMS[name]():
            return e2e.bare_step(model, prompts, "off", 4 if warm else steps)

    runs = alternated(list(ARMS), side, repeats)
    return {name: arm_medians(rs, rs[0], "step") for name, rs in runs.items()}


def setup_arg_parser() -> argparse.ArgumentParser:
    return workload_parser(__doc__, "bf16")


def main(argv=None) -> int:
    from bi_rl.bench import e2e

    args = setup_arg_parser().parse_args(argv)
    try:
        models, batches = workload_args(args)
    except ValueError as e:
        print(f"off_step_parts: {e}", file=sys.stderr)
        return 2
    w = e2e.WORKLOADS[args.workload]
    graphs = os.environ.get("MLX_USE_CUDA_GRAPHS", "1")
    rows = []
    for label, model, b in each_batch(args, models, batches):
        prompts = e2e.make_prompts(b, w.prompt_lens, w.shape["vocab_size"], seed=b)
        row = {"model": label, "batch": b, "cuda_graphs": graphs}
        row |= time_batch(model, prompts, args.steps, args.repeats)
        masked = first_logits(model, prompts)
        with mask_dropped():
            dropped = first_logits(model, prompts)
        row["logits_differing"] = int((masked != dropped).sum())
        rows.append(row)
        parts = " | ".join(
            f"{a}: step {row[a]['step']:6.2f} build {row[a]['build']:5.2f} "
            f"submit {row[a]['submit']:5.2f} wait {row[a]['wait']:5.2f} ms"
            for a in ARMS
        )
        ratio = row["no_mask"]["step"] / row["masked"]["step"]
        print(
            f"{label:6} B={b:<3} graphs={graphs} {parts} | no_mask/masked {ratio:.3f}, "
            f"logits differing {row['logits_differing']}, spread "
            f"{max(row[a]['spread'] for a in ARMS):.2f}",
            flush=True,
        )
    write_rows(args, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
