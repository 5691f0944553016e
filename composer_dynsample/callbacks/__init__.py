"""Composer callbacks: one file each; and the regression harness of Composer's batch-sampler epoch fix."""

from composer_dynsample.callbacks.checkpoint_on_interrupt import CheckpointOnInterrupt
from composer_dynsample.callbacks.composer_epoch_fix import (
    reverted_batch_sampler_fix,
    reverted_batch_sampler_fix_fixture,
)
from composer_dynsample.callbacks.progress_lines import ProgressLines
from composer_dynsample.callbacks.retrieval_gallery import RetrievalGallery
from composer_dynsample.callbacks.set_sampler_epoch import SetSamplerEpoch

__all__ = [
    "CheckpointOnInterrupt",
    "ProgressLines",
    "RetrievalGallery",
    "SetSamplerEpoch",
    "reverted_batch_sampler_fix",
    "reverted_batch_sampler_fix_fixture",
]
