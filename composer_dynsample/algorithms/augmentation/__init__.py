"""Batched, seeded random affine augmentation at ``Event.AFTER_DATALOADER``, on the training device.

See the method card, ``README.md`` in this folder.
"""

from composer_dynsample.algorithms.augmentation.augmentation import (
    BatchAugmentation,
    augmentation_generator,
    random_affine,
)

__all__ = ["BatchAugmentation", "augmentation_generator", "random_affine"]
