"""What PKBatchSampler says when K exceeds what the classes hold: the K that works, in plain words."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from composer_dynsample import PKBatchSampler


@pytest.mark.parametrize(
    ("counts", "p", "k", "expected"),
    [
        # Every class the same size (pairs: 2 rows each): K must be that size.
        (
            [2] * 640,
            32,
            4,
            "classes_per_batch=32 x samples_per_class=4 cannot be satisfied: every one of the 640 classes has "
            "exactly 2 samples; use samples_per_class=2 or small_classes='replace' (which repeats samples in "
            "a batch).",
        ),
        # Any K up to that size works.
        (
            [8] * 4,
            2,
            9,
            "classes_per_batch=2 x samples_per_class=9 cannot be satisfied: every one of the 4 classes has "
            "exactly 8 samples; use samples_per_class in [2, 8] or small_classes='replace' (which repeats "
            "samples in a batch).",
        ),
        # And P more than the classes: both change, together.
        (
            [2] * 6,
            8,
            3,
            "classes_per_batch=8 x samples_per_class=3 cannot be satisfied: every one of the 6 classes has "
            "exactly 2 samples; use classes_per_batch in [2, 6] with samples_per_class=2.",
        ),
        (
            [1] * 5,
            3,
            2,
            "classes_per_batch=3 x samples_per_class=2 cannot be satisfied: every one of the 5 classes has "
            "exactly 1 sample; use small_classes='replace' (which repeats samples in a batch).",
        ),
        # A range of one K is that K.
        (
            [10, 6, 2, 2],
            3,
            5,
            "classes_per_batch=3 x samples_per_class=5 cannot be satisfied: only 2 of 4 classes have 5 samples "
            "or more (small_classes='drop'); use classes_per_batch in [2, 2] or samples_per_class=2 (3 classes "
            "have that many) or small_classes='replace'.",
        ),
        # No single change works: a P and a K that do.
        (
            [10, 6, 1],
            4,
            7,
            "classes_per_batch=4 x samples_per_class=7 cannot be satisfied: only 1 of 3 classes have 7 samples "
            "or more (small_classes='drop'); use classes_per_batch=2 with samples_per_class in [2, 6].",
        ),
    ],
)
def test_an_unsatisfiable_k_names_the_k_that_works(counts, p, k, expected):
    labels = np.repeat(np.arange(len(counts)), counts)
    with pytest.raises(ValueError) as error, warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        PKBatchSampler(labels, p, k)
    assert str(error.value) == expected
