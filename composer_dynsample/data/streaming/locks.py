"""Where a split's ``StreamingDataset`` keeps its file locks: in the split's cache folder, not the temp folder.

``StreamingDataset`` names its locks after its shared-memory prefix (``NNNNNN_cache_filelock``, taken when
the first shard is prepared, and ``NNNNNN_barrier_filelock``, taken only by its own iteration) and puts
them in ``tempfile.gettempdir()``, where they stay after the process ends: every run leaves one there per
split, and as each lock file also keeps its prefix from being taken again, the prefixes only grow.

The cache lock guards the cache folder: which shards are downloaded, being downloaded or evicted. Kept in
that folder (``local/<split>/cache_filelock``), it is the one lock of every process that uses the folder,
the ranks of a node and their DataLoader workers, and nothing is ever removed, so no process can be left
holding a lock file another has replaced. Two processes of different prefixes never share a cache folder
(``StreamingDataset`` refuses a folder another live prefix holds), and the shared memory of a prefix,
registered by the node's first rank until it exits, is what keeps another run from taking the prefix.
"""

from __future__ import annotations

import os
from typing import Any

__all__ = ["keep_locks_in_cache"]

CACHE_LOCK = "cache_filelock"
BARRIER_LOCK = "barrier_filelock"


def keep_locks_in_cache(dataset: Any) -> None:
    """Point ``dataset``'s (a ``StreamingDataset`` of one stream, as built, no shard prepared yet) cache and
    barrier locks at its stream's cache folder; its DataLoader workers take the paths with the dataset.

    Example:
        >>> import types
        >>> stream = types.SimpleNamespace(local="/cache/pairs", split="train")
        >>> dataset = types.SimpleNamespace(streams=[stream], _shared_barrier=types.SimpleNamespace())
        >>> keep_locks_in_cache(dataset)
        >>> dataset._cache_filelock_path, dataset._shared_barrier.filelock_path
        ('/cache/pairs/train/cache_filelock', '/cache/pairs/train/barrier_filelock')
    """
    (stream,) = dataset.streams
    folder = os.path.join(stream.local, stream.split or "")
    dataset._cache_filelock_path = os.path.join(folder, CACHE_LOCK)
    dataset._shared_barrier.filelock_path = os.path.join(folder, BARRIER_LOCK)
