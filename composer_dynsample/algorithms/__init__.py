"""Composer algorithms: one folder each, a pure function plus a thin ``Algorithm``."""

from composer_dynsample.algorithms.hard_negative_mining import CrossBatchMemory, HardNegativeMining, mine

__all__ = ["CrossBatchMemory", "HardNegativeMining", "mine"]
