"""MosaicML Streaming's lock files in the temp folder, removed when the process that made them ends.

``StreamingDataset`` names two file locks after its shared-memory prefix (``NNNNNN_cache_filelock``, taken
when a shard is prepared, and ``NNNNNN_barrier_filelock``, taken by its own iteration) and puts them in
``tempfile.gettempdir()``, where they stay after the process ends: every run would leave them behind.

They stay where Streaming puts them while the process lives, and are made as soon as the dataset is: Streaming's
search for a free prefix skips a prefix whose lock files exist without attaching to its shared memory, while
it attaches to (and holds descriptors of) every live prefix without them, which a process making many
datasets (a notebook, a test suite) would pile up. The node's first rank removes its prefix's two files
when it exits (``atexit``: a normal end, an error, Ctrl-C; not a kill), when its shared memory, which keeps
another process from taking the prefix, goes too. DataLoader workers and the other ranks never remove them.
"""

from __future__ import annotations

import atexit
import contextlib
import os
from typing import Any

__all__ = ["hold_locks_until_exit"]

_REGISTERED: set[str] = set()  # the lock files this process removes at exit


def hold_locks_until_exit(dataset: Any) -> list[str]:
    """Make ``dataset``'s (a built ``StreamingDataset``) lock files in the temp folder now and remove them when
    this process exits, if it is the node's first rank (the one that registered the prefix); the files.

    Example:
        >>> import types
        >>> world = types.SimpleNamespace(is_local_leader=True)
        >>> dataset = types.SimpleNamespace(
        ...     _unique_rank_world=world, _shared_barrier=types.SimpleNamespace())
        >>> import tempfile
        >>> folder = tempfile.mkdtemp()
        >>> dataset._cache_filelock_path = f"{folder}/000007_cache_filelock"
        >>> dataset._shared_barrier.filelock_path = f"{folder}/000007_barrier_filelock"
        >>> [os.path.basename(path) for path in hold_locks_until_exit(dataset) if os.path.isfile(path)]
        ['000007_cache_filelock', '000007_barrier_filelock']
    """
    if not getattr(dataset._unique_rank_world, "is_local_leader", False):
        return []
    paths = [dataset._cache_filelock_path, dataset._shared_barrier.filelock_path]
    for path in paths:  # Streaming makes them only when it first takes them
        with contextlib.suppress(OSError), open(path, "a"):
            pass
    new = [path for path in paths if path not in _REGISTERED]
    if new:
        _REGISTERED.update(new)
        atexit.register(_remove, new)
    return paths


def _remove(paths: list[str]) -> None:
    for path in paths:
        with contextlib.suppress(OSError):
            os.remove(path)
