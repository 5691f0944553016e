"""Composer callbacks: one file each."""

from composer_dynsample.callbacks.set_sampler_epoch import SetSamplerEpoch, find_epoch_target

__all__ = ["SetSamplerEpoch", "find_epoch_target"]
