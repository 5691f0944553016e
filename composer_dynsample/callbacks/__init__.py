"""Composer callbacks to train with: one file each.

Each name is imported on first use (PEP 562): ``SetSamplerEpoch`` loads neither the retrieval gallery (and
its store embedding) nor the interrupt handler. The test harnesses that lived here are in
:mod:`composer_dynsample.testing`; their old names still resolve here, with a ``DeprecationWarning``, for
one release.
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any

from composer_dynsample._lazy import lazy_exports, load

_MODULES = {
    "composer_dynsample.callbacks.checkpoint_on_interrupt": "CheckpointOnInterrupt",
    "composer_dynsample.callbacks.progress_lines": "ProgressLines",
    "composer_dynsample.callbacks.retrieval_gallery": "RetrievalGallery",
    "composer_dynsample.callbacks.set_sampler_epoch": "SetSamplerEpoch",
}
#: Names that moved to :mod:`composer_dynsample.testing`.
_MOVED = ("reverted_batch_sampler_fix", "reverted_batch_sampler_fix_fixture")

__all__ = ["CheckpointOnInterrupt", "ProgressLines", "RetrievalGallery", "SetSamplerEpoch"]

if TYPE_CHECKING:
    from composer_dynsample.callbacks.checkpoint_on_interrupt import CheckpointOnInterrupt
    from composer_dynsample.callbacks.progress_lines import ProgressLines
    from composer_dynsample.callbacks.retrieval_gallery import RetrievalGallery
    from composer_dynsample.callbacks.set_sampler_epoch import SetSamplerEpoch

_getattr, __dir__ = lazy_exports(__name__, _MODULES, globals())


def __getattr__(name: str) -> Any:
    if name in _MOVED:
        warnings.warn(
            f"composer_dynsample.callbacks.{name} moved to composer_dynsample.testing.{name}; this name is "
            "removed in the next release.",
            DeprecationWarning,
            stacklevel=2,
        )
        return load("composer_dynsample.testing", name)
    return _getattr(name)
