"""Moved to :mod:`composer_dynsample.testing.device_syncs`; this path warns and is removed in the next release."""

import warnings

from composer_dynsample.testing.device_syncs import *  # noqa: F403
from composer_dynsample.testing.device_syncs import __all__  # noqa: F401

warnings.warn(
    "composer_dynsample.callbacks.device_syncs moved to composer_dynsample.testing (a test harness, not a callback to "
    "train with); import it from there: this path is removed in the next release.",
    DeprecationWarning,
    stacklevel=2,
)
