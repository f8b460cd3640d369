"""The Hopper GEMM kernels a model needs, compiled ahead with a counted message.

On a Hopper GPU bi-rl's bf16/f16 GEMM and quantized-GEMM kernels are compiled by bi-rl itself
with NVRTC (bi_rl.backends.cuda.hopper, hopper_qmm), one cubin per tile configuration, dtype
and epilogue, cached on disk: the first run on a machine spends seconds per kernel. Which
configuration a product runs is a function of its row count M and output width N alone
(`choose_config`), so the set a model can need is known before it runs:

  `gemm_needs(model)`   its matrix products: (kind, activation dtype, N, K, bits), and its
                        sibling projections that a rollout groups into one launch
                        (bi_rl.fusion): ("group" or "qgroup", dtype, the widths, K, bits);
  `plan(needs, rows)`   the (dtype, configuration, epilogue) instantiations dispatch picks
                        for any M from 1 to `rows` (every M where a choice can change);
  `prepare_kernels(model, rows)` compiles those not yet cached, saying "compiling N CUDA
                        kernels (first run on this machine)" and counting them; where
                        everything is cached it prints nothing. Elsewhere (no Hopper GPU,
                        the CPU) it does nothing.

Kernels that MLX itself compiles at their first call (attention, the mma.sync GEMMs of other
GPUs, fused element-wise graphs) cannot be listed this way: bi_rl.verify.warmup runs the
model at representative shapes for those.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable

__all__ = ["gemm_needs", "plan", "prepare_kernels", "sample_rows"]


def gemm_needs(model) -> set[tuple]:
    """(kind, activation dtype, N, K, bits) of every matrix product `model` runs: "linear"
    for nn.Linear without bias and the embedding where it is also the output layer (no
    lm_head), "addmm" with a bias, "qmm" quantized; "group" / "qgroup" a set of sibling
    projections (plain / quantized) with N the tuple of their widths, unless
    BI_RL_GROUP_PROJECTIONS=0 keeps a rollout from grouping them; a set that a run in the
    mode concatenates (bi_rl.concat.chosen_sets) is one "linear" / "qmm" of their summed
    width instead of a group."""
    import os

    import mlx.core as mx
    import mlx.nn as nn

    from bi_rl.concat import chosen_sets
    from bi_rl.fusion import GROUP_ENV, sibling_slots

    needs = set()
    joined = chosen_sets(invariant=True)
    grouped = os.environ.get(GROUP_ENV, "") != "0"
    for _, names, members in sibling_slots(model):
        m = members[0]
        widths = tuple(int(x["weight"].shape[0]) for x in members)
        concatenated = tuple(names) in joined
        if not (concatenated or grouped):
            continue
        n = sum(widths) if concatenated else widths
        if type(m) is nn.QuantizedLinear:
            dt, k = m.scales.dtype, m.weight.shape[1] * 32 // m.bits
            if dt in (mx.bfloat16, mx.float16):
                needs.add(("qmm" if concatenated else "qgroup", dt, n, k, m.bits))
        elif m.weight.dtype in (mx.bfloat16, mx.float16):
            needs.add(
                ("linear" if concatenated else "group", m.weight.dtype, n, m.weight.shape[1], None)
            )
    modules = model.named_modules()
    tied = not any(name.split(".")[-1] == "lm_head" for name, _ in modules)
    for _, m in modules:
        if isinstance(m, nn.QuantizedLinear | nn.QuantizedEmbedding):
            dt = m.scales.dtype
            n, k = m.weight.shape[0], m.weight.shape[1] * 32 // m.bits
            if dt in (mx.bfloat16, mx.float16) and getattr(m, "mode", "affine") == "affine":
                needs.add(("qmm", dt, n, k, m.bits))
        elif isinstance(m, nn.Linear) or (tied and isinstance(m, nn.Embedding)):
            dt = m.weight.dtype
            if dt in (mx.bfloat16, mx.float16):
                kind = "addmm" if "bias" in m else "linear"
                needs.add((kind, dt, *m.weight.shape, None))
    return needs


def sample_rows(rows: int) -> list[int]:
    """Row counts that meet every configuration choice up to `rows`: each M to 129, then one
    per count of 64-row blocks (a choice depends on M through the blocks it fills, which
    hold 8 to 64 rows below 65 and 64 or 128 above)."""
    return sorted({*range(1, min(rows, 129) + 1), *range(129, rows + 1, 64)})


def plan(needs: set[tuple], rows: int) -> list[tuple]:
    """The instantiations dispatch can pick for `needs` at up to `rows` rows: (kind, dtype,
    configuration, bits), without duplicates, in a stable order; a group's kind is
    ("group" or "qgroup", its number of members)."""
    from bi_rl.backends.cuda import hopper, hopper_qmm

    out = {}
    ms = sample_rows(rows)
    for kind, dt, n, k, bits in sorted(needs, key=str):
        if kind == "group":  # the few-row grouped launch: one configuration for its rows
            cfg = hopper.group_config(n) if hopper.narrow_enabled() else None
            if cfg is not None:
                out.setdefault(((kind, len(n)), dt, cfg, bits), None)
            continue
        if kind == "qgroup":  # the decode configuration of each row count up to 64
            for m in ms:
                if m <= hopper_qmm.GROUP_ROWS:
                    cfg = hopper_qmm.group_config(m, n, bits)
                    out.setdefault(((kind, len(n)), dt, cfg, bits), None)
            continue
        for m in ms:
            if kind == "qmm":
                cfg = hopper_qmm.choose_config(m, n, k, bits)
            else:
                cfg = hopper.choose_config(m, n, k)
            out.setdefault((kind, dt, cfg, bits), None)
    return list(out)


def _prepare(job) -> None:
    """Compile the instantiation a model's call runs. Its activations are (batch, positions,
    K), so a product without bias takes the rank-free entry (nd), exactly as dispatch
    prepares it for a 3-D activation (hopper._plan, hopper_qmm._plan); one with a bias goes
    through the 2-D entry with its epilogue."""
    from bi_rl.backends.cuda import hopper, hopper_qmm

    kind, dt, cfg, _ = job
    if isinstance(kind, tuple):
        name, g = kind
        (hopper_qmm if name == "qgroup" else hopper).prepare_group(dt, cfg, g)
    elif kind == "qmm":
        hopper_qmm.prepare(dt, cfg, True)
    elif kind == "addmm":
        hopper.prepare(dt, cfg, True, 1.0, 1.0)  # nn.Linear's bias: alpha = beta = 1
    else:
        hopper.prepare(dt, cfg, False, 1.0, 0.0, True)


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def prepare_kernels(
    model, rows: int, say: Callable[[str], None] = _say, prepare=_prepare, available=None
) -> int:
    """Compile the Hopper kernels `model` can need at up to `rows` rows (module doc); returns
    how many were compiled now. prepare and available stand in for the CUDA side in tests."""
    from bi_rl.backends.cuda import hopper, nvrtc

    if not (hopper.available() if available is None else available):
        return 0
    needs = gemm_needs(model)
    done = (frozenset(needs), rows, prepare)
    if done in _PREPARED:  # this process prepared them already
        return 0
    jobs = plan(needs, rows)
    compiled: list[str] = []
    t0 = time.perf_counter()
    position = [0]

    def counted(label: str) -> None:
        if not compiled:
            left = len(jobs) - position[0]
            say(
                f"bi_rl: compiling up to {left} CUDA kernels (first run on this machine; "
                f"cached in {nvrtc.cache_dir()})"
            )
        compiled.append(label)
        say(f"bi_rl:   [{position[0] + 1}/{len(jobs)}] {label}")

    # NVRTC compiles one kernel at a time in a process (nvrtc.py holds a lock around it), so
    # the jobs run in order and each line can name its place.
    previous, nvrtc.on_compile = nvrtc.on_compile, counted
    try:
        for i, job in enumerate(jobs):
            position[0] = i
            prepare(job)
    finally:
        nvrtc.on_compile = previous
    if compiled:
        say(f"bi_rl: compiled {len(compiled)} CUDA kernels in {time.perf_counter() - t0:.1f} s")
    _PREPARED.add(done)
    return len(compiled)


_PREPARED: set = set()
