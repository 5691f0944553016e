"""Composer callbacks: one file each."""

from composer_dynsample.callbacks.checkpoint_on_interrupt import CheckpointOnInterrupt
from composer_dynsample.callbacks.progress_lines import ProgressLines
from composer_dynsample.callbacks.retrieval_gallery import RetrievalGallery
from composer_dynsample.callbacks.set_sampler_epoch import SetSamplerEpoch

__all__ = ["CheckpointOnInterrupt", "ProgressLines", "RetrievalGallery", "SetSamplerEpoch"]
