"""Composer callbacks: one file each."""

from typing import Any

from composer_dynsample.callbacks.checkpoint_on_interrupt import CheckpointOnInterrupt
from composer_dynsample.callbacks.retrieval_gallery import RetrievalGallery
from composer_dynsample.callbacks.set_sampler_epoch import SetSamplerEpoch, find_epoch_target

__all__ = ["CheckpointOnInterrupt", "RetrievalGallery", "SetSamplerEpoch", "find_epoch_target"]


def __getattr__(name: str) -> Any:
    """``embed_store`` moved to :mod:`composer_dynsample.models.embed` (a deprecation warning says so)."""
    if name == "embed_store":
        from composer_dynsample.callbacks import retrieval_gallery

        return retrieval_gallery.__getattr__(name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
