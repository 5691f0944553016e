"""The text cache folder: where it is, a cheap check that it can be written, and one error line when not.

Before anything is tokenized or trained for it, the cache folder is created and a file written and
removed in it (:func:`check_cache_dir`); a folder that is a file, read-only or full, there or while a
token store or a trained tokenizer is written, is one :class:`TokenCacheError` line naming the folder
and what to do (:func:`cache_write_error`).
"""

from __future__ import annotations

import errno
import os
import tempfile
from pathlib import Path

__all__ = ["TokenCacheError", "cache_write_error", "check_cache_dir", "text_cache_dir"]


class TokenCacheError(ValueError):
    """A token cache folder that cannot be used: damaged, from another layout, or not writable."""


def text_cache_dir(cache_dir: str | os.PathLike[str] | None) -> Path:
    """Where the text loaders cache tokens and trained tokenizers: ``cache_dir``, or ``default_cache_dir()/text``."""
    if cache_dir is not None:
        return Path(cache_dir).expanduser()
    from composer_dynsample.data.splits import default_cache_dir

    return default_cache_dir() / "text"


def _blocking_file(directory: Path) -> Path | None:
    """The file that stands where ``directory`` or one of its parents should be a folder, if any."""
    for path in (directory, *directory.parents):
        if path.exists() or path.is_symlink():
            return None if path.is_dir() else path
    return None


def cache_write_error(directory: Path, error: OSError) -> TokenCacheError:
    """The one-line error for a cache folder that cannot be written: what the system said, and what to do.

    Example:
        >>> import errno
        >>> print(cache_write_error(Path("/c"), OSError(errno.ENOSPC, "No space left on device")))
        cannot write the text cache in /c: No space left on device; free space there, or set cache_dir to a folder on a disk with room.
    """
    reason = error.strerror or str(error) or type(error).__name__
    blocking = _blocking_file(directory) if error.errno in (errno.EEXIST, errno.ENOTDIR) else None
    if blocking is not None:
        what = f"{blocking} is a file, not a folder; set cache_dir to a folder, or move the file away"
    elif error.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        what = f"{reason}; make it writable, or set cache_dir to a folder you can write"
    elif error.errno in (errno.ENOSPC, errno.EDQUOT):
        what = f"{reason}; free space there, or set cache_dir to a folder on a disk with room"
    else:
        what = f"{reason}; set cache_dir to another folder"
    return TokenCacheError(f"cannot write the text cache in {directory}: {what}.")


def check_cache_dir(directory: str | os.PathLike[str]) -> None:
    """Create the cache folder ``directory`` if needed, and write and remove a file in it: a cheap check
    made before anything is computed for it.

    Raises:
        TokenCacheError: If the folder cannot be created or written (see :func:`cache_write_error`).
    """
    folder = Path(directory).expanduser()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(prefix=".write-check-", dir=folder)
        os.close(fd)
        os.unlink(name)
    except OSError as error:
        raise cache_write_error(folder, error) from error
