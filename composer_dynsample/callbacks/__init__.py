"""Composer callbacks: one file each."""

from composer_dynsample._lazy import moved_names
from composer_dynsample.callbacks.checkpoint_on_interrupt import CheckpointOnInterrupt
from composer_dynsample.callbacks.retrieval_gallery import RetrievalGallery
from composer_dynsample.callbacks.set_sampler_epoch import SetSamplerEpoch, find_epoch_target

__all__ = ["CheckpointOnInterrupt", "RetrievalGallery", "SetSamplerEpoch", "find_epoch_target"]

# embed_store moved to composer_dynsample.models.embed.
__getattr__ = moved_names(__name__, {"embed_store": "composer_dynsample.models.embed"})
