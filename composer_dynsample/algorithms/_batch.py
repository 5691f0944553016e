"""Old home of the batch lookup, now public in :mod:`composer_dynsample.batches`."""

from composer_dynsample._lazy import moved_names

__getattr__ = moved_names(
    __name__,
    {name: "composer_dynsample.batches" for name in ("batch_rows", "batch_tensor", "find_in_batch")},
)
