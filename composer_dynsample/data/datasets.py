"""Loaders that return a train and a test :class:`~composer_dynsample.data.TensorStore`.

Every loader returns a :class:`DatasetSplits` (``train``, ``test``, ``num_classes``, ``name``) with
float32 features and int64 labels.

Bundled data:

* :func:`load_mnist1d`: MNIST-1D (Greydanus 2020), regenerated locally with the ``mnist1d`` package
  and its default arguments: 4000 train and 1000 test sequences of length 40, 10 classes. Features are
  ``(N, 40)``; a 1-D conv model adds the channel itself (``x.unsqueeze(1)``, or
  :class:`~composer_dynsample.data.Unsqueeze` as the collate transform). The generated arrays are
  cached as ``mnist1d_seed{seed}.npz`` in ``cache_dir``.
* :func:`load_digits`: scikit-learn's bundled 8x8 digits (1797 samples, 64 features in [0, 1],
  10 classes), split 80/20 stratified by class with a fixed seed.

Your own data, :func:`load_file`:

* ``.npz`` (``numpy.savez``): arrays ``features`` ``(N, ...)`` (any real dtype, cast to float32) and
  ``labels`` ``(N,)`` (an integer dtype); optionally ``test_features`` and ``test_labels``.
* ``.pt`` / ``.pth`` (``torch.save``): a dict with the same keys whose values are tensors (loaded
  with ``weights_only=True``, so it holds nothing but tensors and plain containers).

  Without test arrays, the file is split by :func:`stratified_split` with ``test_fraction``.

* a directory of images: :func:`~composer_dynsample.data.images.load_image_folder`.

Malformed content, or a path that is neither a regular file nor a directory (a named pipe would block),
raises :class:`ValueError` naming the file and what was expected; a missing file
raises :class:`FileNotFoundError`.
"""

from __future__ import annotations

import dataclasses
import os
import random
import stat
import tempfile
import zipfile
import zlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from composer_dynsample.data.store import TensorStore
from composer_dynsample.validation import check_float, check_int

__all__ = [
    "DatasetSplits",
    "default_cache_dir",
    "load_digits",
    "load_file",
    "load_mnist1d",
    "stratified_split",
]

_MNIST1D_TRAIN, _MNIST1D_TEST, _MNIST1D_LENGTH, _MNIST1D_CLASSES = 4000, 1000, 40, 10


@dataclasses.dataclass(frozen=True)
class DatasetSplits:
    """A dataset's train and test splits.

    Attributes:
        train (TensorStore): The training split.
        test (TensorStore): The test split.
        num_classes (int): The number of classes: ``max label + 1`` over both splits.
        name (str): A short name for logs.
        class_names (tuple[str, ...] | None): The name of each label, ``class_names[label]`` (an image
            folder's class folders), or ``None`` when the data names none. Keyword only.
            Default: ``None``.

    Raises:
        ValueError: If ``class_names`` does not hold one string per class.

    Example:
        >>> train, test = TensorStore(torch.zeros(2, 1), [0, 1]), TensorStore(torch.zeros(1, 1), [1])
        >>> splits = DatasetSplits(train, test, num_classes=2, name="toy", class_names=["cat", "dog"])
        >>> splits.name, len(splits.train), len(splits.test), splits.class_names
        ('toy', 2, 1, ('cat', 'dog'))
    """

    train: TensorStore
    test: TensorStore
    num_classes: int
    name: str
    class_names: tuple[str, ...] | None = dataclasses.field(default=None, kw_only=True)

    def __post_init__(self) -> None:
        if self.class_names is None:
            return
        names = tuple(self.class_names)
        if len(names) != self.num_classes or not all(isinstance(item, str) for item in names):
            raise ValueError(
                f"class_names must hold one string per class ({self.num_classes}), got {self.class_names!r}."
            )
        object.__setattr__(self, "class_names", names)  # frozen: a list given is stored as a tuple


def default_cache_dir() -> Path:
    """Where generated data is cached when no ``cache_dir`` is given.

    ``$COMPOSER_DYNSAMPLE_CACHE`` if set, else ``$XDG_CACHE_HOME/composer_dynsample``, else
    ``~/.cache/composer_dynsample``.

    Example:
        >>> default_cache_dir().name != ""
        True
    """
    explicit = os.environ.get("COMPOSER_DYNSAMPLE_CACHE")
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "composer_dynsample"


def stratified_split(
    labels: np.ndarray | torch.Tensor, test_fraction: float, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """Split indices into train and test, taking ``test_fraction * n_c`` (rounded half up) of each class.

    Deterministic in ``(labels, test_fraction, seed)``; both index arrays are sorted ascending. A class
    with ``test_fraction * n_c < 0.5`` (e.g. a single item at 0.2) stays wholly in train.

    Args:
        labels (np.ndarray | torch.Tensor): ``(N,)`` integer labels.
        test_fraction (float): In ``(0, 1)``.
        seed (int): Seed of the per-class permutations. Default: ``0``.

    Returns:
        tuple[np.ndarray, np.ndarray]: The int64 train and test indices.

    Raises:
        ValueError: If ``test_fraction`` is not in ``(0, 1)``.

    Example:
        >>> train, test = stratified_split(np.array([0, 0, 0, 0, 1, 1, 1, 1]), 0.25, seed=0)
        >>> len(train), len(test)
        (6, 2)
    """
    check_float(
        "test_fraction", test_fraction, minimum=0, maximum=1, strict_minimum=True, strict_maximum=True
    )
    label_array = labels.cpu().numpy() if isinstance(labels, torch.Tensor) else np.asarray(labels)
    rng = np.random.default_rng(seed)
    test_parts = []
    for cls in np.unique(label_array):
        members = np.flatnonzero(label_array == cls)
        n_test = int(np.floor(test_fraction * len(members) + 0.5))  # round half up
        test_parts.append(rng.permutation(members)[:n_test])
    test = np.sort(np.concatenate(test_parts)) if test_parts else np.empty(0, dtype=np.int64)
    is_test = np.zeros(len(label_array), dtype=bool)
    is_test[test] = True
    return np.flatnonzero(~is_test).astype(np.int64), test.astype(np.int64)


def _num_classes(*stores: TensorStore) -> int:
    top = max((int(s.labels.max()) for s in stores if len(s)), default=-1)
    return top + 1


def atomic_savez(path: Path, **arrays: np.ndarray) -> None:
    """Write an ``.npz`` so that a concurrent reader (another rank) never sees a partial file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=path.stem + ".", suffix=".tmp.npz", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            np.savez(handle, **arrays)
        os.chmod(tmp_name, 0o644)  # mkstemp creates 0600; a shared cache should be readable
        os.replace(tmp_name, path)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise


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


# Everything np.load and zipfile raise on a truncated or corrupt archive (a bad CRC, a broken
# central directory, a damaged deflate stream, an unsupported compression method, ...).
_NPZ_READ_ERRORS = (OSError, EOFError, KeyError, NotImplementedError, zipfile.BadZipFile, zlib.error)
_ZIP_MAGICS = (b"PK\x03\x04", b"PK\x05\x06")  # what np.load recognises as an .npz (zip) archive
_NPY_MAGIC = b"\x93NUMPY"


def _read_npz(path: Path) -> dict[str, Any]:
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
            arrays = _read_npz(path)
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


def _check_labels(
    path: Path, key: str, array: np.ndarray, num_items: int, features_key: str, saved_dtype: object = None
) -> torch.Tensor:
    if array.dtype == np.bool_ or not np.issubdtype(array.dtype, np.integer):
        raise ValueError(
            f"{path}: {key!r} must have an integer dtype, got {saved_dtype or array.dtype}; "
            "save labels as int64 (e.g. labels.astype('int64'))."
        )
    if array.ndim != 1:
        raise ValueError(f"{path}: {key!r} must be 1-D (N,), got shape {array.shape}.")
    if len(array) != num_items:
        raise ValueError(
            f"{path}: {key!r} has {len(array)} entries but {features_key!r} has {num_items} rows; "
            "they must match."
        )
    return torch.from_numpy(array.astype(np.int64))


def _store_from_arrays(
    path: Path, arrays: Mapping[str, Any], features_key: str, labels_key: str
) -> TensorStore:
    features = _check_features(path, features_key, _to_numpy(path, features_key, arrays[features_key]))
    raw_labels = arrays[labels_key]
    labels = _check_labels(
        path,
        labels_key,
        _to_numpy(path, labels_key, raw_labels),
        len(features),
        features_key,
        saved_dtype=raw_labels.dtype if isinstance(raw_labels, torch.Tensor) else None,
    )
    return TensorStore(features, labels)


def _read_arrays(path: Path) -> Mapping[str, Any]:
    suffix = path.suffix.lower()
    if suffix == ".npz":
        return _read_npz(path)
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


def _special_file_kind(mode: int) -> str:
    """What a file that is neither a regular file nor a directory is, in words."""
    kinds = (
        (stat.S_ISFIFO, "a named pipe, FIFO"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
    )
    return next((words for test, words in kinds if test(mode)), "a special file")


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
    if not file.exists():
        raise FileNotFoundError(f"{file}: no such file or directory.")
    mode = file.stat().st_mode
    if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):  # opening a named pipe would wait for a writer
        raise ValueError(
            f"{file}: not a regular file ({_special_file_kind(mode)}); "
            "expected an .npz, .pt or .pth file, or a directory of images."
        )
    if stat.S_ISDIR(mode):
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
    return DatasetSplits(
        train=train, test=test, num_classes=_num_classes(train, test), name=name or file.stem
    )
