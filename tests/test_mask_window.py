"""The window a boolean mask was built with, noted beside it (bi_rl/_mask_window.py).

Properties: the window comes back only for the very array object it was noted for, and only
where the call's query and key counts are the mask's last two axes (the alignment it was
built for); an equal mask that was not noted and a mask of another kind give None, and an
entry does not keep its mask alive, so a hint can be lost but never attached to a mask it
does not describe.
"""

import gc
import weakref

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


def test_an_entry_holds_its_mask_weakly_and_goes_with_it():
    """A prefill's mask can be large: noting it must not keep it alive, and once it is gone
    no entry is left for a later array that takes its id."""
    mask = window_mask(2, 8, 3)
    ref = weakref.ref(mask)
    mask_window.note(mask, 3)
    assert mask_window.noted() == 1
    del mask
    gc.collect()
    assert ref() is None, "the note kept the mask alive"
    assert mask_window.noted() == 0
    again = window_mask(2, 8, 3)
    assert mask_window.window_of(again, 2, 8) is None
    mask_window.note(again, 3)
    mask_window.note(again, 5)  # noted again: the latest window counts
    assert mask_window.window_of(again, 2, 8) == 5 and mask_window.noted() == 1
