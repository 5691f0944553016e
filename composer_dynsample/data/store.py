"""An index-only dataset and a collate function that gathers whole batches from a preloaded tensor store.

The dataset never builds feature tensors: :class:`IndexDataset` returns ``(index, label)`` as Python
ints, which is all a model-aware batch sampler needs, and :class:`GatherCollate` turns the list of
items of one batch into a dict of tensors with a single ``index_select`` on the :class:`TensorStore`::

    store = TensorStore(features, labels)
    loader = DataLoader(
        IndexDataset(store.labels),
        batch_sampler=batch_sampler,
        collate_fn=GatherCollate(store),
        num_workers=2,
        pin_memory=True,
    )
    batch = next(iter(loader))  # {"index": (B,), "features": (B, ...), "labels": (B,)}

Both classes are plain picklable objects (no lambdas or closures), so ``num_workers > 0`` works with
the ``fork`` and ``spawn`` start methods; with ``spawn`` the store's tensors are sent to each worker
once, through PyTorch's shared-memory tensor pickling. A batch holds tensors only, so
``pin_memory=True`` works.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from composer_dynsample.validation import as_labels, is_int

__all__ = ["GatherCollate", "IndexDataset", "TensorStore", "Unsqueeze"]

_LABEL_MESSAGES = {  # a store words the length check as the features' and labels' agreement
    "length": "features and labels must have the same length, got {num_items} features and {count} labels."
}


class TensorStore:
    """Features and labels of a whole split, held in memory and validated once.

    Args:
        features (torch.Tensor | np.ndarray): ``(N, ...)`` floating-point features, at least 2-D, all finite.
        labels (torch.Tensor | np.ndarray | Sequence[int]): ``(N,)`` integer labels; stored as int64.

    Raises:
        TypeError: If ``features`` is not floating point.
        ValueError: If the shapes, lengths or label dtype are wrong, or ``features`` holds NaN or inf.

    Example:
        >>> store = TensorStore(torch.zeros(4, 3), torch.tensor([0, 1, 0, 1]))
        >>> len(store), store.feature_shape, store.num_classes
        (4, (3,), 2)
        >>> store.gather(torch.tensor([3, 0])).shape
        torch.Size([2, 3])
    """

    def __init__(
        self, features: torch.Tensor | np.ndarray, labels: torch.Tensor | np.ndarray | Sequence[int]
    ) -> None:
        if isinstance(features, np.ndarray):
            features = torch.from_numpy(np.ascontiguousarray(features))
        if not isinstance(features, torch.Tensor):
            raise TypeError(f"features must be a torch.Tensor or numpy array, got {type(features).__name__}.")
        if not features.is_floating_point():
            raise TypeError(
                f"features must be floating point, got dtype {features.dtype}; "
                "cast it first, e.g. features.float()."
            )
        if features.ndim < 2:
            raise ValueError(f"features must be at least 2-D (N, ...), got shape {tuple(features.shape)}.")
        label_tensor = as_labels("labels", labels, features.shape[0], to="torch", messages=_LABEL_MESSAGES)
        features = features.detach().cpu().contiguous()
        if not bool(torch.isfinite(features).all()):
            bad = int((~torch.isfinite(features)).flatten(1).any(1).nonzero()[0, 0])
            raise ValueError(f"features must be finite, but row {bad} holds NaN or inf.")
        self.features = features
        self.labels = label_tensor

    def __len__(self) -> int:
        return self.labels.shape[0]

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(num_items={len(self)}, feature_shape={self.feature_shape}, "
            f"dtype={self.features.dtype}, num_classes={self.num_classes})"
        )

    @property
    def feature_shape(self) -> tuple[int, ...]:
        """The shape of one item's features (``features.shape[1:]``)."""
        return tuple(self.features.shape[1:])

    @property
    def num_classes(self) -> int:
        """The number of distinct labels."""
        return int(torch.unique(self.labels).numel())

    def gather(self, index: torch.Tensor) -> torch.Tensor:
        """Return ``features[index]`` with one ``index_select``.

        Args:
            index (torch.Tensor): 1-D int64 indices.

        Returns:
            torch.Tensor: ``(len(index), ...)`` features.
        """
        return self.features.index_select(0, index)


class IndexDataset(torch.utils.data.Dataset):
    """A map-style dataset whose items are ``(index, label)`` Python ints, nothing else.

    Args:
        labels (torch.Tensor | np.ndarray | Sequence[int]): ``(N,)`` integer labels, e.g. ``store.labels``.

    Attributes:
        labels (torch.Tensor): The int64 labels, for building samplers.

    Example:
        >>> dataset = IndexDataset([3, 1, 3])
        >>> len(dataset), dataset[2], dataset[-1]
        (3, (2, 3), (2, 3))
    """

    def __init__(self, labels: torch.Tensor | np.ndarray | Sequence[int]) -> None:
        self.labels = as_labels("labels", labels, to="torch")
        self._label_list: list[int] = self.labels.tolist()

    def __len__(self) -> int:
        return len(self._label_list)

    def __getitem__(self, index: int) -> tuple[int, int]:
        try:
            i = int(index)  # accepts Python, numpy and 0-d tensor integers
        except (TypeError, ValueError):
            raise TypeError(f"IndexDataset index must be an integer, got {type(index).__name__}.") from None
        n = len(self._label_list)
        if not -n <= i < n:
            raise IndexError(f"index {i} is out of range for an IndexDataset of length {n}.")
        if i < 0:
            i += n
        return i, self._label_list[i]

    def __getitems__(self, indices: Sequence[int]) -> list[tuple[int, int]]:
        """Batched lookup: ``DataLoader`` calls this once per batch instead of ``__getitem__`` per item."""
        return [self[i] for i in indices]

    def __repr__(self) -> str:
        return f"{type(self).__name__}(num_items={len(self)})"


class GatherCollate:
    """Collate ``(index, label)`` items into ``{"index", "features", "labels"}`` from a :class:`TensorStore`.

    Features are gathered with one ``index_select`` on the store; labels come from the store too, so the
    items may also be bare indices. An optional ``transform`` is applied to the gathered ``(B, ...)``
    features tensor (batched, in the worker process); it must be picklable for ``num_workers > 0`` with
    the ``spawn`` start method, e.g. an instance of a module-level class such as :class:`Unsqueeze`.

    Args:
        store (TensorStore): Where the features and labels live.
        transform (Callable[[torch.Tensor], torch.Tensor], optional): Applied to the features of a batch.
            Default: ``None``.

    Example:
        >>> store = TensorStore(torch.arange(8.0).view(4, 2), [0, 0, 1, 1])
        >>> batch = GatherCollate(store)([(2, 1), (0, 0)])
        >>> batch["index"].tolist(), batch["features"].tolist(), batch["labels"].tolist()
        ([2, 0], [[4.0, 5.0], [0.0, 1.0]], [1, 0])
    """

    def __init__(
        self, store: TensorStore, transform: Callable[[torch.Tensor], torch.Tensor] | None = None
    ) -> None:
        if not isinstance(store, TensorStore):
            raise TypeError(f"store must be a TensorStore, got {type(store).__name__}.")
        if transform is not None and not callable(transform):
            raise TypeError(f"transform must be callable or None, got {type(transform).__name__}.")
        self.store = store
        self.transform = transform

    def __call__(self, items: Sequence[Any]) -> dict[str, torch.Tensor]:
        if len(items) == 0:
            raise ValueError("GatherCollate got an empty batch.")
        first = items[0]
        indices = [item[0] for item in items] if isinstance(first, (tuple, list)) else list(items)
        index = torch.as_tensor(indices, dtype=torch.int64)
        if index.ndim != 1:
            raise ValueError(
                f"GatherCollate expects one index per item, got indices of shape {tuple(index.shape)}."
            )
        n = len(self.store)
        if bool(((index < 0) | (index >= n)).any()):
            raise IndexError(f"GatherCollate got indices outside [0, {n - 1}] for a store of {n} items.")
        features = self.store.gather(index)
        if self.transform is not None:
            features = self.transform(features)
        return {"index": index, "features": features, "labels": self.store.labels.index_select(0, index)}

    def __repr__(self) -> str:
        return f"{type(self).__name__}(store={self.store!r}, transform={self.transform!r})"


class Unsqueeze:
    """A picklable batch transform that inserts a dimension, e.g. ``(B, 40) -> (B, 1, 40)`` for a 1-D conv.

    Args:
        dim (int): Where to insert the new dimension. Default: ``1``.

    Example:
        >>> Unsqueeze(1)(torch.zeros(2, 40)).shape
        torch.Size([2, 1, 40])
    """

    def __init__(self, dim: int = 1) -> None:
        if not is_int(dim):
            raise TypeError(f"dim must be an int, got {dim!r}.")
        self.dim = int(dim)

    def __call__(self, features: torch.Tensor) -> torch.Tensor:
        return features.unsqueeze(self.dim)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(dim={self.dim})"
