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
"""

from __future__ import annotations

import math
import os
import shutil
import socket
import uuid
from pathlib import Path

import torch

from composer_dynsample.distributed import barrier, broadcast_object, gather_objects, get_local_rank, get_rank

__all__ = ["node_shared_rows"]


def node_shared_rows(
    shape: tuple[int, int], dtype: torch.dtype, folder: str | os.PathLike[str]
) -> torch.Tensor:
    """A zeroed ``shape`` tensor of ``dtype`` whose memory is a file in ``folder`` that the node's ranks share.

    A collective: every rank calls it at the same point (all of them allocate their table together).

    Raises:
        ValueError: If ``folder`` cannot be created or written, or lacks the space for the table.
    """
    folder = Path(folder).expanduser()
    numel = math.prod(shape)
    nbytes = numel * torch.empty(0, dtype=dtype).element_size()
    tag = broadcast_object(uuid.uuid4().hex if get_rank() == 0 else "")
    path = folder / f"embedding-table-{tag}-{socket.gethostname()}.bin"  # a folder on a shared disk too
    failure = ""
    if get_local_rank() == 0:
        try:
            folder.mkdir(parents=True, exist_ok=True)
            free = shutil.disk_usage(folder).free
            if free < nbytes:
                failure = (
                    f"{folder} has {free / 2**30:.1f} GiB free, the table needs {nbytes / 2**30:.1f} GiB"
                )
            else:
                with open(path, "wb") as handle:
                    handle.truncate(nbytes)  # sparse: zeros that take no disk until written
        except OSError as error:
            failure = f"{folder}: {error.strerror or error}"
    failed = next((str(text) for text in gather_objects(failure) if text), "")
    if failed:  # every rank raises, none waits for the others
        raise ValueError(
            f"EmbeddingTable: storage_dir: {failed}; give storage_dir a folder with room for it."
        )
    rows = torch.from_file(str(path), shared=True, size=numel, dtype=dtype).view(shape)
    barrier()  # every rank has mapped it: the file can go, the mapping stays
    if get_local_rank() == 0:
        path.unlink(missing_ok=True)
    return rows
