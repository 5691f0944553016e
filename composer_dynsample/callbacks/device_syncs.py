"""Deprecated: moved to :mod:`composer_dynsample.testing`; this path warns and is removed in the next release."""

import warnings

from composer_dynsample.testing import SYNCING_OPS, SyncOpCounter, SyncOpsPerStep, syncs_on_cuda

__all__ = ["SYNCING_OPS", "SyncOpCounter", "SyncOpsPerStep", "syncs_on_cuda"]

warnings.warn(
    "composer_dynsample.callbacks.device_syncs moved to composer_dynsample.testing (a test harness, not a callback "
    f"to train with): import {', '.join(__all__)} from composer_dynsample.testing; this path is removed in "
    "the next release.",
    DeprecationWarning,
    stacklevel=2,
)
