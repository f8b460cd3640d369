"""The window a boolean mask was built with, noted beside it (bi_rl/_mask_window.py).

Properties: the window comes back only for the very array object it was noted for, and only
where the call's query and key counts are the mask's last two axes (the alignment it was
built for); an equal mask that was not noted, a mask of another kind and a mask noted long
ago (past KEEP newer entries) give None, so a hint can be lost but never attached to a mask
it does not describe.
"""

import mlx.core as mx
import pytest

from bi_rl import _mask_window as mask_window
from bi_rl.backends.composed import window_mask


@pytest.fixture(autouse=True)
def empty():
    mask_window.forget()
    yield
    mask_window.forget()


def test_the_window_comes_back_for_that_mask_object_at_its_own_shape():
    mask = window_mask(3, 10, 4)
    mask_window.note(mask, 4)
    assert mask_window.window_of(mask, 3, 10) == 4
    batched = mx.broadcast_to(window_mask(3, 10, 4), (2, 1, 3, 10))
    mask_window.note(batched, 4)
    assert mask_window.window_of(batched, 3, 10) == 4
    assert mask_window.window_of(mask, 2, 10) is None, "other query count"
    assert mask_window.window_of(mask, 3, 11) is None, "other key count"
    assert mask_window.window_of(window_mask(3, 10, 4), 3, 10) is None, "equal, not noted"
    assert mask_window.window_of(mask[1:], 2, 10) is None, "a slice is another array"


def test_only_boolean_masks_are_noted():
    additive = mx.where(window_mask(3, 10, 4), 0.0, -float("inf"))
    mask_window.note(additive, 4)
    mask_window.note("causal", 4)
    mask_window.note(mx.array([True, False]), 4)  # one axis: no (queries, keys) to check
    assert mask_window.window_of(additive, 3, 10) is None
    assert mask_window.window_of("causal", 3, 10) is None


def test_old_entries_drop_out_past_keep_and_lose_only_the_hint():
    masks = [window_mask(2, 8, 3) for _ in range(mask_window.KEEP + 1)]
    for m in masks:
        mask_window.note(m, 3)
    assert mask_window.window_of(masks[0], 2, 8) is None, "the oldest entry dropped"
    assert all(mask_window.window_of(m, 2, 8) == 3 for m in masks[1:])
    mask_window.note(masks[1], 5)  # noted again: the latest window counts
    assert mask_window.window_of(masks[1], 2, 8) == 5
