"""Scikit-learn's bundled 8x8 digits: :func:`load_digits`.

1797 samples, 64 features in [0, 1], 10 classes, split 80/20 stratified by class with a fixed seed.
"""

from __future__ import annotations

import numpy as np
import torch

from composer_dynsample.data.splits import DatasetSplits, stratified_split
from composer_dynsample.data.store import TensorStore

__all__ = ["load_digits"]


def load_digits(test_fraction: float = 0.2, seed: int = 0) -> DatasetSplits:
    """Load scikit-learn's bundled 8x8 digits, scaled to [0, 1] and split stratified by class.

    Args:
        test_fraction (float): Fraction of each class in the test split, in ``(0, 1)``. Default: ``0.2``.
        seed (int): Seed of the split. Default: ``0``.

    Returns:
        DatasetSplits: 1797 samples in all (1438 train and 359 test by default), 64 features, 10 classes,
        ``name`` ``"digits"``.

    Raises:
        ImportError: If scikit-learn is not installed.

    Example:
        >>> splits = load_digits()
        >>> len(splits.train) + len(splits.test), splits.train.feature_shape, splits.num_classes
        (1797, (64,), 10)
    """
    try:
        from sklearn.datasets import load_digits as sklearn_load_digits
    except ImportError as error:
        raise ImportError("load_digits needs scikit-learn: pip install scikit-learn") from error
    bunch = sklearn_load_digits()
    features = (np.asarray(bunch.data, dtype=np.float32) / 16.0).clip(0.0, 1.0)
    labels = np.asarray(bunch.target, dtype=np.int64)
    train_idx, test_idx = stratified_split(labels, test_fraction, seed)
    train = TensorStore(torch.from_numpy(features[train_idx]), torch.from_numpy(labels[train_idx]))
    test = TensorStore(torch.from_numpy(features[test_idx]), torch.from_numpy(labels[test_idx]))
    return DatasetSplits(train=train, test=test, num_classes=10, name="digits")
