"""Old home of :class:`~composer_dynsample.mining.CrossBatchMemory`, now in :mod:`composer_dynsample.mining.memory`."""

from composer_dynsample._lazy import moved_names

__getattr__ = moved_names(__name__, {"CrossBatchMemory": "composer_dynsample.mining.memory"})
