"""The embedding table's rows in one memory-mapped file per node, shared by the node's ranks.

Every rank holds the same table (each writes every rank's gathered rows), so 8 ranks of a node hold 8
copies of it: at 10 million pairs x 384 in float16, 8 x 7.7 GB. :func:`node_shared_rows` maps one file
per node instead (``EmbeddingTable(storage_dir=...)``): the node's local rank 0 creates it (sparse, so
zeros cost no disk), every rank maps it shared, and once all have mapped it the file is unlinked, so it
lives exactly as long as the ranks that map it (a crash leaves nothing behind). The kernel's page cache
holds one copy per node and can write cold pages back to the file's disk.

Why the ranks may all write into one copy without a lock: they write the same values (the rows are
gathered from every rank before they are written), and the rows of step ``t + 1`` are written only after
the all-gather of step ``t + 1``, which every rank enters after writing step ``t``'s; so no rank's older
write can land after a newer one, and what a rank reads it has itself written, or another rank wrote
identically.

The file's name holds a tag drawn for the run and the global rank of the node's first rank, and it is
created only when no file has that name: two runs, or two nodes of one host name, given one folder each
map a file of their own. A folder that cannot hold the file (a file, under a file, not writable, too small),
a rank that cannot map it, or a rank that does not see the file its node's local rank 0 made (ranks whose
``~`` or working folder differ) is a :class:`StorageDirError` on every rank, naming the folder and the fix,
and the file is not left behind; :func:`check_storage_dir` refuses a value that names no folder (not a
path, an empty string, a NUL byte) when the table is made. A leading ``~`` is the user's home folder.
"""

from __future__ import annotations

import contextlib
import math
import os
import shutil
import socket
import uuid
from pathlib import Path

import torch

from composer_dynsample.distributed import broadcast_object, gather_objects, get_local_rank, get_rank

__all__ = ["StorageDirError", "check_storage_dir", "node_shared_rows"]


class StorageDirError(ValueError):
    """``EmbeddingTable(storage_dir=...)`` names a folder that cannot hold the table's file."""


def check_storage_dir(storage_dir: object, device: object) -> str | os.PathLike[str] | None:
    """``storage_dir`` once it names a folder (a non-empty path without NUL bytes) for a table on the cpu.

    Only the value is checked: the folder itself is :func:`node_shared_rows`' to check, on every rank at once.

    Raises:
        ValueError: If ``storage_dir`` is not a path, is empty or blank, holds a NUL byte, or the table is
            not on the cpu.
    """
    if storage_dir is None:
        return None
    if not isinstance(storage_dir, (str, os.PathLike)) or not isinstance(os.fspath(storage_dir), str):
        raise ValueError(
            f"storage_dir must be a folder's path (a string), got {storage_dir!r} "
            f"({type(storage_dir).__name__}); give one folder (e.g. storage_dir='/dev/shm'), or leave "
            "storage_dir out for rows in each rank's memory."
        )
    text = os.fspath(storage_dir)
    if torch.device(device).type != "cpu":  # type: ignore[arg-type]
        raise ValueError(
            f"storage_dir must be a folder for a table on the cpu, got {storage_dir!r} on {device!r}; give "
            "device='cpu' or leave storage_dir out."
        )
    if not text.strip() or "\0" in text:
        raise ValueError(
            f"storage_dir must name a folder, got {storage_dir!r}; give a folder (e.g. storage_dir='/dev/shm' "
            "or a local disk's folder), or leave storage_dir out for rows in each rank's memory."
        )
    return storage_dir


def node_shared_rows(
    shape: tuple[int, int], dtype: torch.dtype, folder: str | os.PathLike[str]
) -> torch.Tensor:
    """A zeroed ``shape`` tensor of ``dtype`` whose memory is a file in ``folder`` that the node's ranks share.

    A collective: every rank calls it at the same point (all of them allocate their table together).

    Raises:
        StorageDirError: If ``folder`` is a file or under one, cannot be created or written, lacks the
            space for the table, holds a file of the same name, or a rank cannot map the file or does not
            see it (every rank raises it; the file is not left behind).
    """
    folder = Path(folder).expanduser()
    numel = math.prod(shape)
    nbytes = numel * torch.empty(0, dtype=dtype).element_size()
    tag = broadcast_object(uuid.uuid4().hex if get_rank() == 0 else "")
    node = get_rank() - get_local_rank()  # the global rank of the node's local rank 0: a file per node
    path = folder / f"embedding-table-{tag}-{socket.gethostname()}-{node}.bin"
    failure = _create(path, nbytes) if get_local_rank() == 0 else ""
    failed = next((str(text) for text in gather_objects(failure) if text), "")
    if failed:  # every rank raises, none waits for the others
        raise StorageDirError(f"EmbeddingTable: storage_dir: {failed}.")
    rows, failure = _map(path, numel, dtype)
    failed = next((str(text) for text in gather_objects(failure) if text), "")  # every rank has mapped it
    if get_local_rank() == 0:  # the file can go, the mappings stay
        path.unlink(missing_ok=True)
    if failed:
        raise StorageDirError(f"EmbeddingTable: storage_dir: {failed}.")
    return rows.view(shape)


def _map(path: Path, numel: int, dtype: torch.dtype) -> tuple[torch.Tensor, str]:
    """``path``'s ``numel`` values mapped shared, and ``""``; or an empty tensor and why not, with the fix.

    A rank other than the node's first maps only the file the node's local rank 0 made, never a new one of
    its own (``torch.from_file`` would create a missing file).
    """
    where = f"rank {get_rank()}"
    if get_local_rank() != 0 and not path.is_file():
        return torch.empty(0, dtype=dtype), (
            f"{where} sees no file {path.name} in {str(path.parent)!r}, where local rank 0 made it; give "
            "storage_dir one folder the node's ranks share (an absolute path: '~' and a relative path follow "
            "each rank's HOME and working folder)"
        )
    try:
        return torch.from_file(str(path), shared=True, size=numel, dtype=dtype), ""
    except (OSError, RuntimeError) as error:
        reason = (str(error).strip().splitlines() or [type(error).__name__])[0]
        return torch.empty(0, dtype=dtype), (
            f"{where} cannot map the file in {str(path.parent)!r} ({reason}); give storage_dir a folder with "
            "room for the table"
        )


def _create(path: Path, nbytes: int) -> str:
    """Create ``path``'s folder and the sparse file of ``nbytes`` zeros; ``""``, or why it cannot and the fix."""
    folder = path.parent
    blocker = next((part for part in (folder, *folder.parents) if part.exists() and not part.is_dir()), None)
    if blocker is not None:
        where = f"{str(folder)!r} is a file" if blocker == folder else f"{str(blocker)!r} is a file"
        return f"{where}, not a folder; give storage_dir a folder (it is created when missing)"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        free = shutil.disk_usage(folder).free
        if free < nbytes:
            return (
                f"{str(folder)!r} has {free / 2**30:.1f} GiB free, the table needs {nbytes / 2**30:.1f} GiB; "
                "give storage_dir a folder with room for it"
            )
        with open(path, "xb") as handle:  # never another run's file
            handle.truncate(nbytes)  # sparse: zeros that take no disk until written
    except FileExistsError:
        return (
            f"{str(path)!r} exists already, another run's node file of the same name; give this run a "
            "storage_dir of its own"
        )
    except OSError as error:
        with contextlib.suppress(OSError):
            path.unlink(missing_ok=True)
        return (
            f"{str(folder)!r} cannot be written ({error.strerror or error}); give storage_dir a folder you "
            "can write in, with room for the table"
        )
    return ""
