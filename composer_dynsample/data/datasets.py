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

from composer_dynsample._lazy import moved_names

_SPLITS = "composer_dynsample.data.splits"
__getattr__ = moved_names(
    __name__,
    {
        "DatasetSplits": _SPLITS,
        "default_cache_dir": _SPLITS,
        "stratified_split": _SPLITS,
        "atomic_savez": _SPLITS,
        "load_mnist1d": "composer_dynsample.data.mnist1d",
        "load_digits": "composer_dynsample.data.digits",
        "load_file": "composer_dynsample.data.files",
    },
)
