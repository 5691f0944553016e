"""The loaders moved out of composer_dynsample.data.datasets; the old names still work, with a warning."""

from __future__ import annotations

import pytest

from composer_dynsample.data import datasets, digits, files, mnist1d, splits


def test_the_old_names_in_datasets_still_work_with_a_deprecation_warning():
    for module, name in (
        (splits, "DatasetSplits"),
        (splits, "default_cache_dir"),
        (splits, "stratified_split"),
        (splits, "atomic_savez"),
        (mnist1d, "load_mnist1d"),
        (digits, "load_digits"),
        (files, "load_file"),
    ):
        with pytest.warns(DeprecationWarning, match=f"moved to {module.__name__}.{name}; the old name goes"):
            assert getattr(datasets, name) is getattr(module, name)
    with pytest.raises(AttributeError):
        datasets.no_such_name  # noqa: B018
    with pytest.raises(AttributeError):
        datasets._generate_mnist1d  # noqa: B018
