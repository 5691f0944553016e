"""Deprecated: moved to :mod:`composer_dynsample.testing`; this path warns and is removed in the next release."""

import warnings

from composer_dynsample.testing import (
    PATCHED_NAME,  # noqa: F401  (a constant of the old module)
    reverted_batch_sampler_fix,
    reverted_batch_sampler_fix_fixture,
)

__all__ = ["reverted_batch_sampler_fix", "reverted_batch_sampler_fix_fixture"]

warnings.warn(
    "composer_dynsample.callbacks.composer_epoch_fix moved to composer_dynsample.testing (a test harness, not a "
    f"callback to train with): import {', '.join(__all__)} from composer_dynsample.testing; this path is "
    "removed in the next release.",
    DeprecationWarning,
    stacklevel=2,
)
