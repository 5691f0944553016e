"""Deprecated: moved to :mod:`composer_dynsample.testing`; this path warns and is removed in the next release."""

import warnings

from composer_dynsample.testing import HOST_READS, HostReadCounter, HostReadsPerStep, caller_of, origin_of

__all__ = ["HOST_READS", "HostReadCounter", "HostReadsPerStep", "caller_of", "origin_of"]

warnings.warn(
    "composer_dynsample.callbacks.host_reads moved to composer_dynsample.testing (a test harness, not a callback "
    f"to train with): import {', '.join(__all__)} from composer_dynsample.testing; this path is removed in "
    "the next release.",
    DeprecationWarning,
    stacklevel=2,
)
