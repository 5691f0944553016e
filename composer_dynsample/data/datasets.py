"""The loaders that lived here moved, one module per loader; the old names still work, with a warning.

* :class:`~composer_dynsample.data.splits.DatasetSplits`,
  :func:`~composer_dynsample.data.splits.default_cache_dir`,
  :func:`~composer_dynsample.data.splits.stratified_split` and
  :func:`~composer_dynsample.data.splits.atomic_savez`: :mod:`composer_dynsample.data.splits`.
* :func:`~composer_dynsample.data.mnist1d.load_mnist1d`: :mod:`composer_dynsample.data.mnist1d`.
* :func:`~composer_dynsample.data.digits.load_digits`: :mod:`composer_dynsample.data.digits`.
* :func:`~composer_dynsample.data.files.load_file` (and the file formats it reads):
  :mod:`composer_dynsample.data.files`.

Reading one of these names from this module raises a :class:`DeprecationWarning` naming its new module;
this module goes away in the next release. Import them from :mod:`composer_dynsample.data` or their
new module.
"""

from __future__ import annotations

import importlib
import warnings
from typing import Any

_MOVED = {
    "DatasetSplits": "composer_dynsample.data.splits",
    "default_cache_dir": "composer_dynsample.data.splits",
    "stratified_split": "composer_dynsample.data.splits",
    "atomic_savez": "composer_dynsample.data.splits",
    "load_mnist1d": "composer_dynsample.data.mnist1d",
    "load_digits": "composer_dynsample.data.digits",
    "load_file": "composer_dynsample.data.files",
}


def __getattr__(name: str) -> Any:
    """The names that moved to :mod:`~composer_dynsample.data.splits`, ``mnist1d``, ``digits`` and ``files``."""
    module = _MOVED.get(name)
    if module is not None:
        warnings.warn(
            f"composer_dynsample.data.datasets.{name} moved to {module}.{name}; "
            "the old name goes away in the next release.",
            DeprecationWarning,
            stacklevel=2,
        )
        return getattr(importlib.import_module(module), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
