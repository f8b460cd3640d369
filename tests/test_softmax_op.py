"""mx.softmax inside the mode: routed to the backend's invariant softmax over the last axis.

Properties (CPU, where the backend's softmax is MLX's own over the last axis): every axis
form mx.softmax takes (last, another, None, a one-element list, precise or not) gives the
bits of stock MLX's last-axis softmax of the array with that axis moved last (None: the
whole array as one row) and goes through the backend op (counted); several axes at once are
refused in strict mode naming the op, and run stock with a warning otherwise; outside the
mode nothing is routed.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from bi_rl import _stock, backends, batch_invariant_mode
from bi_rl.backends.base import Backend


def _bits(x):
    return np.array(x.astype(mx.float32)).view(np.uint32)


@pytest.fixture
def counted(monkeypatch):
    calls = []
    active = backends.active()

    def softmax(x, precise=False):
        calls.append((x.shape, precise))
        return active.ops["softmax"](x, precise)

    ops = {**active.ops, "softmax": softmax}
    monkeypatch.setattr(backends, "active", lambda: Backend(active.name, ops))
    return calls


@pytest.mark.parametrize("axis", [-1, 2, 0, 1, None, [1]])
@pytest.mark.parametrize("precise", [False, True])
def test_every_axis_form_gives_stock_bits_through_the_backend(axis, precise, counted):
    x = mx.random.normal((3, 4, 5), key=mx.random.key(1)).astype(mx.bfloat16)
    # ours: the axis moved last (None: the array as one row), then the last-axis op
    if axis is None:
        want = _stock.softmax(x.reshape(-1), -1, precise=precise).reshape(x.shape)
    else:
        a = axis[0] if isinstance(axis, list) else axis
        moved = _stock.softmax(mx.moveaxis(x, a, -1), -1, precise=precise)
        want = mx.moveaxis(moved, -1, a)
    with batch_invariant_mode():
        got = mx.softmax(x, axis, precise=precise)
    assert got.shape == x.shape and got.dtype == x.dtype
    assert (_bits(got) == _bits(want)).all()
    assert len(counted) == 1 and counted[0][1] == precise


def test_several_axes_are_refused_in_strict_mode_and_warned_otherwise(counted):
    x = mx.ones((2, 3, 4))
    with batch_invariant_mode(), pytest.raises(NotImplementedError, match="softmax"):
        mx.softmax(x, axis=[1, 2])
    with batch_invariant_mode(strict=False), pytest.warns(UserWarning, match="softmax"):
        got = mx.softmax(x, axis=[1, 2])
    assert (_bits(got) == _bits(_stock.softmax(x, [1, 2]))).all()
    mx.softmax(x, axis=-1)  # outside the mode: stock, not routed
    assert counted == []
