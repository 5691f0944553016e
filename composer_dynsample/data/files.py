"""Load your own data with :func:`load_file`: an ``.npz``, a ``.pt``/``.pth`` or a directory of images.

* ``.npz`` (``numpy.savez``): arrays ``features`` ``(N, ...)`` (any real dtype, cast to float32) and
  ``labels`` ``(N,)`` (an integer dtype); optionally ``test_features`` and ``test_labels``.
* ``.pt`` / ``.pth`` (``torch.save``): a dict with the same keys whose values are tensors (loaded
  with ``weights_only=True``, so it holds nothing but tensors and plain containers).

  Without test arrays, the file is split by :func:`~composer_dynsample.data.splits.stratified_split`
  with ``test_fraction``.

* a directory of images: :func:`~composer_dynsample.data.images.load_image_folder`.

Malformed content, or a path that is neither a regular file nor a directory (a named pipe would block),
raises :class:`ValueError` naming the file and what was expected; a missing file
raises :class:`FileNotFoundError`. :func:`read_npz` reads every array of an ``.npz`` without pickle
(the MNIST-1D cache reads its file with it too).
"""

from __future__ import annotations

import os
import zipfile
import zlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from composer_dynsample.data.splits import DatasetSplits, num_classes, stratified_split
from composer_dynsample.data.store import TensorStore
from composer_dynsample.file_checks import check_path_kind
from composer_dynsample.validation import as_labels

__all__ = ["load_file", "read_npz"]

_LABEL_MESSAGES = {
    "dtype": "{name} must have an integer dtype, got {dtype}; save labels as int64 (e.g. labels.astype('int64')).",
    "ndim": "{name} must be 1-D (N,), got shape {shape}.",
}


# Everything np.load and zipfile raise on a truncated or corrupt archive (a bad CRC, a broken
# central directory, a damaged deflate stream, an unsupported compression method, ...).
_NPZ_READ_ERRORS = (OSError, EOFError, KeyError, NotImplementedError, zipfile.BadZipFile, zlib.error)
_ZIP_MAGICS = (b"PK\x03\x04", b"PK\x05\x06")  # what np.load recognises as an .npz (zip) archive
_NPY_MAGIC = b"\x93NUMPY"


def read_npz(path: Path) -> dict[str, Any]:
    """Read every array of an ``.npz`` without pickle; raise ``ValueError`` naming ``path`` if it cannot."""
    try:
        with open(path, "rb") as handle:
            magic = handle.read(len(_NPY_MAGIC))
    except OSError as error:
        raise ValueError(f"{path}: not a readable .npz file ({error}).") from error
    if magic.startswith(_NPY_MAGIC):
        raise ValueError(
            f"{path}: not a readable .npz file (it holds a single .npy array, as numpy.save writes); "
            "save a dict of arrays with numpy.savez(path, features=..., labels=...)."
        )
    if not magic.startswith(_ZIP_MAGICS):
        raise ValueError(f"{path}: not a readable .npz file (not a zip archive, as numpy.savez writes).")
    try:
        with np.load(path, allow_pickle=False) as loaded:
            return {key: loaded[key] for key in loaded.files}
    except ValueError as error:
        if "pickle" in str(error):  # object arrays need pickle
            raise ValueError(
                f"{path}: could not read the .npz without pickle ({error}); save plain numeric arrays."
            ) from error
        raise ValueError(f"{path}: not a readable .npz file ({error}).") from error
    except _NPZ_READ_ERRORS as error:
        raise ValueError(
            f"{path}: not a readable .npz file ({type(error).__name__}: {error}); "
            "it may be truncated or corrupt."
        ) from error


# Floating dtypes that Tensor.numpy() converts; bfloat16 and the float8 types have no numpy dtype.
_NUMPY_FLOAT_DTYPES = (torch.float16, torch.float32, torch.float64)


def _to_numpy(path: Path, key: str, value: Any) -> np.ndarray:
    if isinstance(value, torch.Tensor):
        tensor = value.detach().cpu()
        if tensor.is_floating_point() and tensor.dtype not in _NUMPY_FLOAT_DTYPES:
            tensor = tensor.float()  # exact for bfloat16 and float8; the features become float32 anyway
        try:
            return tensor.numpy()
        except (TypeError, RuntimeError) as error:
            raise ValueError(
                f"{path}: {key!r} could not be converted to an array ({error}); "
                "save a dense tensor of real numbers."
            ) from error
    if isinstance(value, np.ndarray):
        return value
    if isinstance(value, (list, tuple)):
        try:
            return np.asarray(value)
        except ValueError as error:
            raise ValueError(f"{path}: {key!r} must be a rectangular array, got a ragged list.") from error
    raise ValueError(f"{path}: {key!r} must be a tensor or array, got {type(value).__name__}.")


def _check_features(path: Path, key: str, array: np.ndarray) -> torch.Tensor:
    if array.dtype == np.bool_ or not (
        np.issubdtype(array.dtype, np.floating) or np.issubdtype(array.dtype, np.integer)
    ):
        raise ValueError(f"{path}: {key!r} must hold real numbers, got dtype {array.dtype}.")
    if array.ndim < 2:
        raise ValueError(f"{path}: {key!r} must be at least 2-D (N, ...), got shape {array.shape}.")
    features = array.astype(np.float32)
    finite = np.isfinite(features)
    if not finite.all():
        row = int(np.flatnonzero(~finite.reshape(len(features), -1).all(axis=1))[0])
        raise ValueError(f"{path}: {key!r} must be finite, but row {row} holds NaN or inf.")
    return torch.from_numpy(np.ascontiguousarray(features))


def _store_from_arrays(
    path: Path, arrays: Mapping[str, Any], features_key: str, labels_key: str
) -> TensorStore:
    features = _check_features(path, features_key, _to_numpy(path, features_key, arrays[features_key]))
    raw = arrays[labels_key]  # a tensor as saved, so that a wrong dtype is named as torch names it
    labels = as_labels(
        f"{path}: {labels_key!r}",
        raw if isinstance(raw, (torch.Tensor, np.ndarray)) else _to_numpy(path, labels_key, raw),
        len(features),
        repr(features_key),
        to="torch",
        messages=_LABEL_MESSAGES,
    )
    return TensorStore(features, labels)


def _read_arrays(path: Path) -> Mapping[str, Any]:
    suffix = path.suffix.lower()
    if suffix == ".npz":
        return read_npz(path)
    if suffix in (".pt", ".pth"):
        try:
            content = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as error:
            raise ValueError(
                f"{path}: could not load with torch.load(weights_only=True) "
                f"({type(error).__name__}: {error}); "
                "save a dict of tensors with keys 'features' and 'labels'."
            ) from error
        if not isinstance(content, Mapping):
            raise ValueError(
                f"{path}: expected a dict with keys 'features' and 'labels', got {type(content).__name__}."
            )
        return content
    raise ValueError(
        f"{path}: unsupported file type {suffix!r}; expected .npz, .pt or .pth (or a directory of images)."
    )


def load_file(
    path: str | os.PathLike[str],
    *,
    test_fraction: float | None = None,
    seed: int = 0,
    name: str | None = None,
    grayscale: bool | None = None,
    size: tuple[int, int] | list[int] | None = None,
) -> DatasetSplits:
    """Load your own data from an ``.npz``, a ``.pt``/``.pth`` or an image directory.

    See the module docstring for the formats. If the file holds ``test_features``/``test_labels`` they
    form the test split; otherwise the file is split with :func:`stratified_split`.

    Args:
        path (str | os.PathLike): The file, or a directory for :func:`load_image_folder`.
        test_fraction (float, optional): Fraction held out when the file has no test arrays; must be
            ``None`` when it has them. Default: ``None`` (``0.2`` when a split is needed).
        seed (int): Seed of the split. Default: ``0``.
        name (str, optional): The name in the result. Default: the file's stem.
        grayscale (bool, optional): For a directory of images: ``True`` one channel, ``False`` three.
            Default: ``None``: three channels if any image has colour, else one.
        size (tuple[int, int] | list[int], optional): For a directory of images: resize every image to
            ``(H, W)``. Default: ``None`` (all images must have the same size).

    Returns:
        DatasetSplits: float32 features, int64 labels, ``num_classes = max label + 1``; for a directory,
        ``class_names`` holds the class folders' names.

    Raises:
        FileNotFoundError: If ``path`` does not exist.
        ValueError: If ``path`` is neither a regular file nor a directory (a named pipe would block the
            run), if ``grayscale`` or ``size`` is given for a file, or if the content is malformed: a missing key, wrong dimensions, non-integer labels,
            a length mismatch or NaN/inf features.

    Example:
        >>> import tempfile, os
        >>> file = os.path.join(tempfile.mkdtemp(), "toy.npz")
        >>> np.savez(file, features=np.random.rand(10, 3), labels=np.arange(10) % 2)
        >>> splits = load_file(file, test_fraction=0.2)
        >>> len(splits.train), len(splits.test), splits.num_classes, splits.name
        (8, 2, 2, 'toy')
    """
    file = Path(path).expanduser()
    # opening a named pipe would wait for a writer: refused before anything is opened
    if check_path_kind(file, "an .npz, .pt or .pth file, or a directory of images", directory=True):
        from composer_dynsample.data.images import load_image_folder

        return load_image_folder(
            file, size=size, grayscale=grayscale, test_fraction=test_fraction, seed=seed, name=name
        )
    given = [
        f"{key}={value!r}" for key, value in (("grayscale", grayscale), ("size", size)) if value is not None
    ]
    if given:
        raise ValueError(
            f"{file}: {' and '.join(given)} apply to a directory of images only, not to a "
            f"{file.suffix or 'suffix-less'} file; leave them out."
        )
    return _load_arrays(file, test_fraction, seed, name)


def _load_arrays(file: Path, test_fraction: float | None, seed: int, name: str | None) -> DatasetSplits:
    """:func:`load_file` of an ``.npz``, ``.pt`` or ``.pth`` file."""
    arrays = _read_arrays(file)
    missing = [key for key in ("features", "labels") if key not in arrays]
    if missing:
        raise ValueError(
            f"{file}: missing key(s) {missing}; expected 'features' (N, ...) and 'labels' (N,), "
            f"optionally 'test_features' and 'test_labels'; found {sorted(arrays)}."
        )
    has_test = [key in arrays for key in ("test_features", "test_labels")]
    if any(has_test) and not all(has_test):
        raise ValueError(
            f"{file}: 'test_features' and 'test_labels' must be given together; found {sorted(arrays)}."
        )
    train = _store_from_arrays(file, arrays, "features", "labels")
    if all(has_test):
        if test_fraction is not None:
            raise ValueError(
                f"{file}: holds a test split already; test_fraction must be None, got {test_fraction!r}."
            )
        test = _store_from_arrays(file, arrays, "test_features", "test_labels")
        if test.feature_shape != train.feature_shape:
            raise ValueError(
                f"{file}: 'test_features' rows have shape {test.feature_shape} "
                f"but 'features' rows have {train.feature_shape}."
            )
    else:
        train_idx, test_idx = stratified_split(
            train.labels, 0.2 if test_fraction is None else test_fraction, seed
        )
        whole = train
        train = TensorStore(whole.features[train_idx], whole.labels[train_idx])
        test = TensorStore(whole.features[test_idx], whole.labels[test_idx])
    return DatasetSplits(train=train, test=test, num_classes=num_classes(train, test), name=name or file.stem)
