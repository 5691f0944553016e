"""The loaders moved out of composer_dynsample.data.datasets; the old names still work, with a warning."""

from __future__ import annotations

import pytest

from composer_dynsample.data import datasets, digits, files, mnist1d, splits
from tests.moved_names import assert_moved, assert_no_such_name


def test_the_old_names_in_datasets_still_work_with_a_deprecation_warning():
    moves = [
        (splits, "DatasetSplits"),
        (splits, "default_cache_dir"),
        (splits, "stratified_split"),
        (splits, "atomic_savez"),
        (mnist1d, "load_mnist1d"),
        (digits, "load_digits"),
        (files, "load_file"),
    ]
    assert_moved([(datasets, module, name) for module, name in moves], then="; the old name goes")
    assert_no_such_name(datasets)
    with pytest.raises(AttributeError):
        datasets._generate_mnist1d  # noqa: B018
