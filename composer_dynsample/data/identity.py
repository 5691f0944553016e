"""What a checkpoint records of the data it was trained on, and what differs from a run's data.

:func:`data_identity` is plain strings and integers (row counts, SHA-256s of the labels, the rows and the
data files); :func:`data_changes` compares two of them, and :class:`DataChangedError` is what a resume on
other data raises (see :class:`~composer_dynsample.config.run.DataIdentity`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

from composer_dynsample.checkpoints import CheckpointError

__all__ = ["DataChangedError", "data_changes", "data_identity"]


class DataChangedError(CheckpointError):
    """A checkpoint was trained on other data than the run's: what differs, without the checkpoint's name.

    Attributes:
        changes (list[str]): What differs, one phrase each.
    """

    def __init__(self, changes: Sequence[str]) -> None:
        super().__init__("; ".join(changes))
        self.changes = list(changes)


#: Rows of a feature store hashed for its identity, evenly spaced: enough to tell data sets apart cheaply.
_SAMPLED_ROWS = 1024


def data_identity(splits: Any) -> dict[str, Any]:
    """What a checkpoint records of the data it was trained on: plain strings and integers.

    ``train_rows`` and ``test_rows``, the SHA-256 of the train labels (``train_labels``), of what the
    training rows hold (``train_items``: the hash of every row's normalised text and whether it is a
    query, for a text split; 1,024 evenly spaced rows of a feature split) and, for text data, ``files``:
    the SHA-256 of every data file read, by its path.

    Args:
        splits (DatasetSplits): The run's data.

    Returns:
        dict[str, Any]: The identity, equal for equal data.
    """
    import numpy as np

    train = splits.train
    labels = np.ascontiguousarray(np.asarray(train.labels), dtype=np.int64)
    files = dict(getattr(getattr(splits, "info", None), "files", None) or {})
    return {
        "train_rows": len(train),
        "test_rows": len(splits.test),
        "train_labels": hashlib.sha256(labels.tobytes()).hexdigest(),
        "train_items": _items_sha256(train),
        "files": files,
    }


def _items_sha256(store: Any) -> str:
    """The SHA-256 of a text split's rows (each row's text hash, query or not), or of sampled feature rows."""
    import numpy as np

    digest = hashlib.sha256()
    text_hash = getattr(store, "text_hash", None)
    if text_hash is not None:
        digest.update(np.ascontiguousarray(text_hash, dtype=np.int64).tobytes())
        digest.update(np.ascontiguousarray(store.is_query, dtype=bool).tobytes())
        return digest.hexdigest()
    import torch

    features = store.features
    rows = np.unique(np.linspace(0, len(store) - 1, min(len(store), _SAMPLED_ROWS)).astype(np.int64))
    sampled = features[torch.from_numpy(rows)].detach().cpu().contiguous()
    digest.update(f"{sampled.dtype}:{tuple(features.shape)}:".encode())
    digest.update(sampled.view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def data_changes(saved: Mapping[str, Any], current: Mapping[str, Any]) -> list[str]:
    """What differs between the data a checkpoint recorded (``saved``) and the run's (``current``).

    Only what the checkpoint recorded is compared. A data file counts by its content: the same file
    under another path is the same data.

    Args:
        saved (Mapping[str, Any]): A :func:`data_identity` read back from a checkpoint.
        current (Mapping[str, Any]): The run's :func:`data_identity`.

    Returns:
        list[str]: One phrase per difference; empty when the data are the same.

    Example:
        >>> data_changes({"train_rows": 4, "test_rows": 2}, {"train_rows": 6, "test_rows": 2})
        ['6 training rows where it had 4']
    """
    changes = _file_changes(dict(saved.get("files") or {}), dict(current.get("files") or {}))
    for key, what in (("train_rows", "training rows"), ("test_rows", "test rows")):
        if saved.get(key) is not None and saved[key] != current.get(key):
            changes.append(f"{current.get(key)} {what} where it had {saved[key]}")
    if changes:
        return changes  # the labels and rows differ too, as follows from these
    if saved.get("train_labels") not in (None, current.get("train_labels")):
        changes.append("the training labels differ")
    elif saved.get("train_items") not in (None, current.get("train_items")):
        what = "texts" if current.get("files") else "features"
        changes.append(f"the training rows hold other {what} (another split of the same data?)")
    return changes


def _file_changes(saved: dict[str, str], current: dict[str, str]) -> list[str]:
    """The data files whose content the checkpoint was not trained on, each with both SHA-256s."""
    if sorted(saved.values()) == sorted(current.values()):
        return []
    changes = []
    for path, digest in current.items():
        if digest in saved.values():
            continue
        if path in saved:
            changes.append(
                f"data file {path!r} has changed (sha256 {saved[path][:12]}... in the checkpoint, "
                f"{digest[:12]}... now)"
            )
        else:
            changes.append(f"data file {path!r} is none of the files it was trained on ({sorted(saved)})")
    return changes or [f"it was trained on data files {sorted(saved)}, not {sorted(current)}"]
