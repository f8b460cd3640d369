"""Queue a forward pass's decoder layers on the device as the host builds them.

A scoring pass builds the whole model's graph on the host (a few milliseconds for a model of
28 layers, more in the mode, whose kernels take more arguments) and is then evaluated, so
with one batch in flight the host's building and the device's work add up. Inside
`queued_layers(model)` each decoder layer's output is handed to `mx.async_eval` as soon as
that layer is built: the device runs layer 0 while the host builds layer 1, and so on, and
the evaluation that follows the pass finds all but the output head already queued.

Invariant kept: nothing computed changes. The same operations run on the same inputs, only
queued earlier, so every output has the bits of the pass evaluated at once (the tests
compare both ways on bit patterns).

The layers are wrapped by shadowing the body's `layers` child with an instance attribute of
the same name for the duration of the context (nn.Module looks children up only when
ordinary attribute lookup fails), so the parameters, the module tree and every other user of
the layer objects are untouched, and leaving the context restores the child even if the
pass raised. The model is the caller's while the context is open: another thread running the
same model object at the same time would also queue its layers (harmless to its bits).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import mlx.core as mx

__all__ = ["LayerQueue", "queued_layers"]


class LayerQueue:
    """Counts the layer outputs queued, and runs a hook once before the next one is queued.

    `arm(before)`: call `before()` just before the next output is queued (the scorer waits
    there for the previous batch, so one batch at a time holds the device's memory)."""

    def __init__(self) -> None:
        self.queued = 0
        self._before: Callable[[], None] | None = None

    def arm(self, before: Callable[[], None]) -> None:
        self._before = before

    def push(self, out) -> None:
        if self._before is not None:
            before, self._before = self._before, None
            before()
        mx.async_eval(out)
        self.queued += 1


class _Queued:
    """A decoder layer whose output goes to `queue.push` when the layer is called; every
    other attribute is the layer's (families read e.g. `layer.use_sliding`)."""

    def __init__(self, layer, queue: LayerQueue):
        self._layer, self._queue = layer, queue

    def __call__(self, *args, **kwargs):
        out = self._layer(*args, **kwargs)
        self._queue.push(out)
        return out

    def __getattr__(self, name):
        return getattr(self._layer, name)


def _body(model):
    """The module holding the decoder layers as a list child `layers` (mlx-lm's
    `Model.model` for the families it ships), or None for another layout."""
    body = model.get("model") if isinstance(model, dict) else None
    if not isinstance(body, dict) or not isinstance(body.get("layers"), list):
        return None
    return body


@contextmanager
def queued_layers(model, enabled: bool = True) -> Iterator[LayerQueue | None]:
    """Queue each decoder layer's output as it is built, inside the context (where
    `enabled`). Yields the LayerQueue, or None (nothing changed) where not enabled, where the
    model's layers are not found or where an enclosing context queues them already."""
    body = _body(model) if enabled else None
    if body is None or "layers" in vars(body):
        yield None
        return
    queue = LayerQueue()
    vars(body)["layers"] = [_Queued(layer, queue) for layer in body["layers"]]
    try:
        yield queue
    finally:
        vars(body).pop("layers", None)
