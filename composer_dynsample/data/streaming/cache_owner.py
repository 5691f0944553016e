"""One run at a time in a ``local`` cache folder: the ranks of one job share it, another job is refused.

Two runs' ``StreamingDataset`` objects over one folder do not share their shard states: a second run
removes the first one's shards (another conversion, :func:`~composer_dynsample.data.streaming.load`'s
``shards.sha256``) or downloads its own shards under the names the first one reads, and one of them then
reads the other's rows. :func:`claim_cache` makes the folder a run's for the life of its process:
``fcntl.flock`` (shared) on ``local/in-use.lock``, whose text names the owning job; the ranks of one
job (one ``MASTER_ADDR:MASTER_PORT``) take it together, any other process is refused in one line. The
operating system releases the lock when its last holder exits, however it exits.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

from composer_dynsample.data.streaming.manifest import StreamingDataError

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX: the folder is not guarded
    fcntl = None  # type: ignore[assignment]

__all__ = ["claim_cache", "release_caches"]

LOCK_NAME = "in-use.lock"
_HELD: dict[str, int] = {}  # cache folder -> the descriptor holding its lock in this process


def _job() -> str:
    """Who this process runs for: its launcher's rendezvous under several ranks, else itself."""
    if int(os.environ.get("WORLD_SIZE", "1") or 1) > 1 and os.environ.get("MASTER_PORT"):
        return f"job {os.environ.get('MASTER_ADDR', 'localhost')}:{os.environ['MASTER_PORT']}"
    return f"pid {os.getpid()}"


def claim_cache(folder: Path, remote: str) -> None:
    """Make ``folder`` this run's cache until the process exits (again: nothing).

    Raises:
        StreamingDataError: If another run (a process of another job) uses ``folder`` now: one line naming
            it and the fix.
    """
    key = str(folder)
    if fcntl is None or key in _HELD:
        return
    job = _job()
    guard = os.open(folder / f"{LOCK_NAME}.guard", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(guard, fcntl.LOCK_EX)  # the check and the note below, one process at a time
        fd = os.open(folder / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            owner, _, described = os.pread(fd, 4096, 0).decode("utf-8", errors="replace").partition("\n")
            if owner != job:
                os.close(fd)
                raise StreamingDataError(
                    f"data.local {key!r} is the cache of another run now ({described.strip() or owner}): "
                    f"two runs' shards would mix there; give this run another data.local, or wait for that "
                    "run to end."
                ) from None
        else:
            note = f"{job}\npid {os.getpid()} on {socket.gethostname()}, reading {remote}"
            os.ftruncate(fd, 0)
            os.pwrite(fd, note.encode("utf-8", errors="replace"), 0)
        fcntl.flock(fd, fcntl.LOCK_SH)  # the job's other ranks take it too
        _HELD[key] = fd
    finally:
        os.close(guard)  # closing it releases the guard


def release_caches() -> None:
    """Release this process's cache folders (their readers forgotten: another run may take them)."""
    while _HELD:
        os.close(_HELD.popitem()[1])
