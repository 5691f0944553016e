"""MNIST-1D (Greydanus 2020), regenerated locally with the ``mnist1d`` package: :func:`load_mnist1d`.

The ``mnist1d`` package's default arguments give 4000 train and 1000 test sequences of length 40,
10 classes. Features are ``(N, 40)``; a 1-D conv model adds the channel itself (``x.unsqueeze(1)``, or
:class:`~composer_dynsample.data.Unsqueeze` as the collate transform). The generated arrays are
cached as ``mnist1d_seed{seed}.npz`` in ``cache_dir``.
"""

from __future__ import annotations

import os
import random
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import torch

from composer_dynsample.data.files import read_npz
from composer_dynsample.data.splits import DatasetSplits, atomic_savez, default_cache_dir
from composer_dynsample.data.store import TensorStore
from composer_dynsample.validation import check_int

__all__ = ["load_mnist1d"]

_MNIST1D_TRAIN, _MNIST1D_TEST, _MNIST1D_LENGTH, _MNIST1D_CLASSES = 4000, 1000, 40, 10


def _generate_mnist1d(seed: int) -> dict[str, np.ndarray]:
    try:
        from mnist1d.data import get_dataset_args, make_dataset
    except ImportError as error:
        raise ImportError("load_mnist1d needs the mnist1d package: pip install mnist1d") from error
    args = get_dataset_args()  # defaults: 5000 samples, train_split 0.8, final_seq_length 40
    args.seed = int(seed)
    # make_dataset reseeds the global numpy and random generators; restore them afterwards.
    numpy_state, python_state = np.random.get_state(), random.getstate()
    try:
        data = make_dataset(args)
    finally:
        np.random.set_state(numpy_state)
        random.setstate(python_state)
    return {
        "features": data["x"].astype(np.float32),
        "labels": data["y"].astype(np.int64),
        "test_features": data["x_test"].astype(np.float32),
        "test_labels": data["y_test"].astype(np.int64),
    }


def _mnist1d_cache_is_valid(arrays: Mapping[str, np.ndarray]) -> bool:
    expected = {
        "features": (_MNIST1D_TRAIN, _MNIST1D_LENGTH),
        "labels": (_MNIST1D_TRAIN,),
        "test_features": (_MNIST1D_TEST, _MNIST1D_LENGTH),
        "test_labels": (_MNIST1D_TEST,),
    }
    return all(key in arrays and arrays[key].shape == shape for key, shape in expected.items())


def load_mnist1d(
    seed: int = 42, cache_dir: str | os.PathLike[str] | None = None, *, regenerate: bool = False
) -> DatasetSplits:
    """Load MNIST-1D, generating it with the ``mnist1d`` package on first use and caching it.

    The first call for a ``seed`` runs ``mnist1d.data.make_dataset`` with its default arguments (a few
    seconds) and writes ``mnist1d_seed{seed}.npz`` into ``cache_dir``; later calls read that file. The
    global ``numpy`` and ``random`` generator states are restored after generation.

    Args:
        seed (int): The generation seed; ``42`` reproduces the published dataset's arguments. Default: ``42``.
        cache_dir (str | os.PathLike, optional): Cache directory. Default: :func:`default_cache_dir`.
        regenerate (bool): Ignore and overwrite an existing cache file. Default: ``False``.

    Returns:
        DatasetSplits: ``train`` (4000, 40), ``test`` (1000, 40), ``num_classes`` 10, ``name`` ``"mnist1d"``.

    Raises:
        ImportError: If ``mnist1d`` is not installed and there is no cache file.

    Example:
        >>> splits = load_mnist1d(cache_dir=tmp_cache_dir)  # doctest: +SKIP
        >>> splits.train.features.shape, splits.test.features.shape, splits.num_classes  # doctest: +SKIP
        (torch.Size([4000, 40]), torch.Size([1000, 40]), 10)
    """
    seed = check_int("seed", seed, minimum=0)
    directory = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    path = directory / f"mnist1d_seed{int(seed)}.npz"
    arrays: dict[str, np.ndarray] | None = None
    if path.is_file() and not regenerate:
        try:
            arrays = read_npz(path)
        except ValueError:
            arrays = None  # a truncated or corrupt cache file is regenerated
        if arrays is not None and not _mnist1d_cache_is_valid(arrays):
            arrays = None
    if arrays is None:
        arrays = _generate_mnist1d(int(seed))
        if not _mnist1d_cache_is_valid(arrays):
            shapes = {key: value.shape for key, value in arrays.items()}
            raise RuntimeError(
                f"mnist1d generated unexpected shapes {shapes}; expected {_MNIST1D_TRAIN}/{_MNIST1D_TEST} "
                f"sequences of length {_MNIST1D_LENGTH}. Is the installed mnist1d version compatible?"
            )
        atomic_savez(path, **arrays)
    train = TensorStore(torch.from_numpy(arrays["features"]), torch.from_numpy(arrays["labels"]))
    test = TensorStore(torch.from_numpy(arrays["test_features"]), torch.from_numpy(arrays["test_labels"]))
    return DatasetSplits(train=train, test=test, num_classes=_MNIST1D_CLASSES, name="mnist1d")
