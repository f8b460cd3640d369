"""Which rank does which work: pure functions of the work list and the number of ranks.

Nothing here looks at time, speed or arrival order, so every rank computes the same split
and a resumed run (with any number of ranks) splits what is left the same way again.

Rollouts (`share_units`): the units left to generate (unit = prompt_index * n + sample) are
grouped by prompt, and the groups dealt to the ranks in turn (group g to rank g mod size),
so a prompt's samples stay together (the engine prefills a shared prompt once) and the
log's canonical order advances on every rank at once (rank 0 can append early records
while later ones are still being made). With fewer prompts left than ranks, single units
are dealt instead, so no rank idles while one prompt's many samples remain.

Rescoring (`share_order`): the rescoring order (a permutation of the records) is cut into
contiguous blocks, one per rank, so each rank batches its samples in the order a single
process would have.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["share_order", "share_units"]


def share_units(units: Sequence[int], n: int, size: int) -> list[list[int]]:
    """units (ascending unit numbers) split among `size` ranks; each share ascending."""
    if size < 1 or n < 1:
        raise ValueError(f"size and n must be >= 1, got size {size}, n {n}")
    units = sorted(units)
    prompts = list(dict.fromkeys(u // n for u in units))
    shares: list[list[int]] = [[] for _ in range(size)]
    if len(prompts) >= size:
        rank_of = {p: i % size for i, p in enumerate(prompts)}
        for u in units:
            shares[rank_of[u // n]].append(u)
    else:
        for i, u in enumerate(units):
            shares[i % size].append(u)
    return shares


def share_order(order: Sequence[int], size: int) -> list[list[int]]:
    """`order` cut into `size` contiguous blocks whose lengths differ by at most one."""
    if size < 1:
        raise ValueError(f"size must be >= 1, got {size}")
    base, extra = divmod(len(order), size)
    out, at = [], 0
    for r in range(size):
        k = base + (r < extra)
        out.append(list(order[at : at + k]))
        at += k
    return out
