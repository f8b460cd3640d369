"""KV caches for batched decoding and for scoring, chosen per layer from the model's own.

mlx-lm gives every model its prompt caches (`make_prompt_cache`): a `KVCache` for a layer
that attends to every earlier token, a `RotatingKVCache(max_size=W)` for a sliding-window
layer (Gemma 3, gpt-oss, ...). Models mix both. `layer_plan(model)` reads them once and
refuses, in one line naming the model family and the mlx-lm version, any cache the engine
cannot batch (state-space caches, quantized caches, rotating caches that keep a prefix).

For batched decoding (`batch_caches`) a full layer gets mlx-lm's left-padded `BatchKVCache`
(as `EngineBatchKVCache`, which drops the mask where no row is padded);
a sliding-window layer gets `WindowedBatchKVCache`, not mlx-lm's `BatchRotatingKVCache`.
The rotating cache overwrites its oldest slot in place, so once a sequence passes the window
its keys sit in rotated order and attention reduces them in an order a full forward pass
never uses: different bits (measured on the CPU, tiny Gemma 3 and gpt-oss in float32: every
logits row after the first wrap differed from the full forward pass). The windowed cache
keeps keys in temporal order, like the full forward pass, and its mask hides keys outside
each query's window (masked keys add exact zeros). It keeps every key, in the layout of
mlx-lm's BatchKVCache: the memory a rotating cache saves is given up, so that the engine's
padding bookkeeping (filter, extend, left padding trimmed by the host) holds for every
layer alike. Dropping keys older than the window would need that bookkeeping per layer kind.
Each mask a windowed cache builds is noted with its window (bi_rl._mask_window), so that an
attention kernel given the mask also knows where each row's window starts and reads nothing
before it; the keys a row attends to, and so its bits, are the mask's either way.

For scoring through a cache (`scoring_caches`) the same holds with mlx-lm's one-offset
`KVCache` and `WindowedKVCache`. Whole-sequence scoring of a model with window layers also
goes through fresh scoring caches, so the window always comes from the cache, as in decode.

Gemma 2 (mlx-lm 0.32.2): its hand-written attention gives scores a query-group axis,
(B, kv heads, group, L, S), but applies a batch cache's (B, 1, L, S) mask as it is, which
fails to broadcast at batch >= 2 with grouped-query heads (or, when B equals the number of
kv heads, masks the wrong rows). `GroupedMaskBatchKVCache` hands it (B, 1, 1, L, S).
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx

from bi_rl import _mask_window as mask_window
from bi_rl.model.load import models_module

# mlx-lm's caches, imported without its package's tokenizer stack (bi_rl.model.load)
_mlx_cache = models_module("cache")
BatchKVCache, KVCache = _mlx_cache.BatchKVCache, _mlx_cache.KVCache
RotatingKVCache, make_prompt_cache = _mlx_cache.RotatingKVCache, _mlx_cache.make_prompt_cache

__all__ = [
    "EngineBatchKVCache",
    "GroupedMaskBatchKVCache",
    "LayerPlan",
    "WindowedBatchKVCache",
    "WindowedKVCache",
    "batch_caches",
    "layer_plan",
    "mlx_lm_version",
    "scoring_caches",
]


def mlx_lm_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("mlx-lm")
    except PackageNotFoundError:
        return "unknown"


def _family(model) -> str:
    kind = getattr(model, "model_type", None) or getattr(
        getattr(model, "args", None), "model_type", None
    )
    return str(kind or type(model).__module__.rsplit(".", 1)[-1])


# Families whose hand-written attention needs the mask's query-group axis (see module doc).
GROUPED_MASK_FAMILIES = ("gemma2",)


@dataclass(frozen=True)
class LayerPlan:
    """Per layer: None (attends to every earlier token) or the sliding window's size."""

    family: str
    windows: tuple[int | None, ...]
    grouped_mask: bool = False  # the Gemma 2 mask fix applies

    @property
    def has_windows(self) -> bool:
        return any(w is not None for w in self.windows)


def layer_plan(model, purpose: str = "the rollout engine") -> LayerPlan:
    """What cache each layer needs; NotImplementedError (one line) for caches not handled."""
    family = _family(model)
    windows, refused = [], {}
    for i, c in enumerate(make_prompt_cache(model)):
        if type(c) is KVCache:
            windows.append(None)
        elif type(c) is RotatingKVCache and c.keep == 0:
            windows.append(int(c.max_size))
        else:
            name = type(c).__name__ + (f"(keep={c.keep})" if isinstance(c, RotatingKVCache) else "")
            refused.setdefault(name, []).append(i)
    if refused:
        what = "; ".join(f"{k} in layers {', '.join(map(str, v))}" for k, v in refused.items())
        raise NotImplementedError(
            f"{family} (mlx-lm {mlx_lm_version()}): {purpose} batches standard and "
            f"sliding-window KV caches only; this model uses {what}: no workaround in bi-rl yet"
        )
    grouped = family in GROUPED_MASK_FAMILIES and any(
        getattr(getattr(layer, "self_attn", None), "repeats", 1) > 1 for layer in model.layers
    )
    return LayerPlan(family, tuple(windows), grouped)


class EngineBatchKVCache(BatchKVCache):
    """BatchKVCache of a full-attention layer that drops the mask when no row is padded.

    mlx-lm's BatchKVCache builds a boolean mask at every step, padded or not. Stock MLX's
    one-query attention kernel on CUDA takes no array mask, so with one, each layer of a stock
    (mode off) decode step runs the unfused attention: six kernels instead of one or two. The engine
    knows each row's padding on the host and sets `padded` (True, the safe default, until it
    says otherwise); with no row padded and no window asked for, a pass gets what mlx-lm's
    single-sequence KVCache gives: no mask for one query, "causal" for several.

    In every mode. The invariant attention reduces each row's keys in position order from its
    first valid key, whatever form says which keys are valid, so no mask, "causal" and the
    boolean mask give one set of bits where no row is padded (the CUDA attention tests compare
    the forms bitwise; the scorer already hands it "causal"). Without the array, a step builds
    no mask and each layer neither reshapes one nor reads it.
    """

    padded: bool = True

    def make_mask(self, N: int, return_array: bool = False, window_size=None, **kwargs):
        if not self.padded and window_size is None:
            if N == 1:
                return None
            if not return_array:
                return "causal"
        return super().make_mask(N, return_array=return_array, window_size=window_size, **kwargs)


class GroupedMaskBatchKVCache(EngineBatchKVCache):
    """BatchKVCache whose array masks carry a query-group axis: (B, 1, 1, L, S)."""

    def make_mask(self, N: int, return_array: bool = False, **kwargs):
        mask = super().make_mask(N, return_array=return_array, **kwargs)
        return mask[:, :, None] if isinstance(mask, mx.array) and mask.ndim == 4 else mask


class WindowedBatchKVCache(BatchKVCache):
    """BatchKVCache for a sliding-window layer: keys in temporal order, the window in the mask.

    The mask hides every key more than `window - 1` positions before its query (mlx-lm's
    create_causal_mask convention, the one a full forward pass uses), also when the model
    does not pass the window itself (mlx-lm's rotating cache supplies it the same way).
    """

    def __init__(self, window: int, left_padding: list[int]):
        super().__init__(left_padding)
        self.window = int(window)

    def make_mask(self, N: int, return_array: bool = False, window_size=None, **kwargs):
        window = window_size or self.window
        mask = super().make_mask(N, window_size=window, **kwargs)
        mask_window.note(mask, window)
        return mask


class WindowedKVCache(KVCache):
    """KVCache (one offset for the whole batch) whose masks apply a sliding window."""

    def __init__(self, window: int):
        super().__init__()
        self.window = int(window)

    def make_mask(self, N: int, return_array: bool = False, window_size=None):
        window = window_size or self.window
        mask = super().make_mask(N, return_array=return_array, window_size=window)
        mask_window.note(mask, window)
        return mask


def batch_caches(plan: LayerPlan, left_padding: list[int]) -> list:
    """One left-padded batch cache per layer for `plan`, empty."""
    full = GroupedMaskBatchKVCache if plan.grouped_mask else EngineBatchKVCache
    return [
        full(left_padding) if w is None else WindowedBatchKVCache(w, left_padding)
        for w in plan.windows
    ]


def scoring_caches(plan: LayerPlan) -> list:
    """One right-padded-batch (single offset) cache per layer for `plan`, empty."""
    return [KVCache() if w is None else WindowedKVCache(w) for w in plan.windows]
