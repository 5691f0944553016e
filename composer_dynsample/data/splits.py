"""What every loader returns, and the helpers the loaders share.

Every loader (:func:`~composer_dynsample.data.mnist1d.load_mnist1d`,
:func:`~composer_dynsample.data.digits.load_digits`, :func:`~composer_dynsample.data.files.load_file`,
:func:`~composer_dynsample.data.glyphs.load_glyphs`, :func:`~composer_dynsample.data.images.load_image_folder`)
returns a :class:`DatasetSplits` (``train``, ``test``, ``num_classes``, ``name``) with float32 features and
int64 labels. Here too: :func:`default_cache_dir` (where generated data is cached), :func:`stratified_split`
(a train/test split by class), :func:`num_classes` (``max label + 1`` over stores) and :func:`atomic_savez`
(an ``.npz`` written so that a concurrent reader never sees a partial file).
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
from pathlib import Path

import numpy as np
import torch

from composer_dynsample.data.store import TensorStore
from composer_dynsample.validation import check_float

__all__ = [
    "DatasetSplits",
    "atomic_savez",
    "default_cache_dir",
    "num_classes",
    "stratified_split",
]


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
        test_name (str): The name of the test split, which results of an evaluation carry: a separate
            test file's stem (``test_path``). Keyword only. Default: ``name``.

    Raises:
        ValueError: If ``class_names`` does not hold one string per class.

    Example:
        >>> train, test = TensorStore(torch.zeros(2, 1), [0, 1]), TensorStore(torch.zeros(1, 1), [1])
        >>> splits = DatasetSplits(train, test, num_classes=2, name="toy", class_names=["cat", "dog"])
        >>> splits.name, len(splits.train), len(splits.test), splits.class_names, splits.test_name
        ('toy', 2, 1, ('cat', 'dog'), 'toy')
    """

    train: TensorStore
    test: TensorStore
    num_classes: int
    name: str
    class_names: tuple[str, ...] | None = dataclasses.field(default=None, kw_only=True)
    test_name: str = dataclasses.field(default="", kw_only=True)

    def __post_init__(self) -> None:
        if not self.test_name:
            object.__setattr__(self, "test_name", self.name)  # frozen
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


def num_classes(*stores: TensorStore) -> int:
    """The number of classes of labelled stores: ``max label + 1`` over all of them, ``0`` if all are empty.

    Example:
        >>> num_classes(TensorStore(torch.zeros(2, 1), [0, 3]), TensorStore(torch.zeros(0, 1), []))
        4
    """
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
