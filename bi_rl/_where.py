"""Which model layer is running: the module path of the innermost mlx.nn.Module on the stack.

Used only to word refusals ("in layer model.layers.3.mlp.switch_mlp.gate_proj"), so it costs
nothing until an op is refused: it walks the calling thread's Python frames then, takes the
innermost frame whose `self` is an nn.Module as the layer and the outermost as the model, and
names the layer by its path in the model's `named_modules()`.
"""

from __future__ import annotations

import sys

import mlx.nn as nn


def current_layer() -> str | None:
    """'path (ClassName)' of the innermost module running on this thread, or None."""
    frame = sys._getframe(1)
    modules: list[nn.Module] = []
    while frame is not None:
        obj = frame.f_locals.get("self") if "self" in frame.f_code.co_varnames else None
        if isinstance(obj, nn.Module) and not any(obj is m for m in modules):
            modules.append(obj)
        frame = frame.f_back
    if not modules:
        return None
    inner, root = modules[0], modules[-1]
    kind = type(inner).__name__
    if inner is root:
        return f"the model's top level ({kind})"
    for name, m in root.named_modules():
        if m is inner:
            return f"{name} ({kind})"
    return kind
