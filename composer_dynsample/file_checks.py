"""What a file the user gives is, and its hash: the checks made on a path before it is read or recorded.

* What a path is, told from its ``stat`` mode before anything opens it. A named pipe would block an
  ``open`` until a writer comes, and a device such as ``/dev/zero`` would feed endless bytes.
  :func:`check_path_kind` refuses both before a data file is opened, and
  :func:`~composer_dynsample.checkpoints.check_checkpoint` before a checkpoint is; both name what they
  found with :func:`file_kind`, from the one table :data:`FILE_KINDS`.
* The SHA-256 of a file's bytes, read in blocks (:func:`file_sha256`): what a manifest, a model card and
  a checked download record.

Example:
    >>> file_kind(os.stat("/dev/null").st_mode)
    'a character device'
"""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Callable, Mapping

__all__ = ["FILE_KINDS", "check_path_kind", "file_kind", "file_sha256"]

#: Each kind of path that is not a regular file, by name: the test of a ``stat`` mode that tells it,
#: and its words in messages; a caller may word any of them its own way (:func:`file_kind`).
FILE_KINDS: dict[str, tuple[Callable[[int], bool], str]] = {
    "directory": (stat.S_ISDIR, "a directory"),
    "fifo": (stat.S_ISFIFO, "a named pipe, FIFO"),
    "socket": (stat.S_ISSOCK, "a socket"),
    "character device": (stat.S_ISCHR, "a character device"),
    "block device": (stat.S_ISBLK, "a block device"),
}


def file_kind(mode: int, *, other: str = "a special file", wording: Mapping[str, str] | None = None) -> str:
    """What a path of ``stat`` mode ``mode`` is, in words, as :data:`FILE_KINDS` names it.

    Args:
        mode (int): The path's ``st_mode``, of anything but a regular file.
        other (str): The words for a kind the table does not name. Default: ``"a special file"``.
        wording (Mapping[str, str], optional): Other words for some kinds, by their name in
            :data:`FILE_KINDS`. Default: none.

    Returns:
        str: The words, e.g. ``"a character device"``.

    Example:
        >>> file_kind(stat.S_IFIFO), file_kind(stat.S_IFIFO, wording={"fifo": "a FIFO (named pipe)"})
        ('a named pipe, FIFO', 'a FIFO (named pipe)')
    """
    words = {kind: name for kind, (_, name) in FILE_KINDS.items()} | dict(wording or {})
    return next((words[kind] for kind, (test, _) in FILE_KINDS.items() if test(mode)), other)


def check_path_kind(path: str | os.PathLike[str], expected: str, *, directory: bool = False) -> bool:
    """Check, before opening it, that ``path`` is a regular file (or a directory, when ``directory``).

    A named pipe would block the open until a writer comes, and a device such as ``/dev/zero`` would
    feed endless bytes; both are refused, also behind a symbolic link (links are followed).

    Args:
        path (str | os.PathLike): The path.
        expected (str): What would be valid, for the message, e.g. ``"a .jsonl or .csv file"``.
        directory (bool): Whether a directory is valid too. Default: ``False``.

    Returns:
        bool: Whether ``path`` is a directory.

    Raises:
        FileNotFoundError: If ``path`` does not exist (a dangling link included).
        ValueError: If it is something else, naming what it is and what was expected.

    Example:
        >>> check_path_kind("/dev/null", "a text file")
        Traceback (most recent call last):
            ...
        ValueError: /dev/null: not a regular file (a character device); expected a text file.
    """
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise FileNotFoundError(f"{os.fspath(path)}: no such file or directory.") from None
    except OSError as error:  # a symbolic link loop, a name too long, a folder we may not read
        raise ValueError(
            f"{os.fspath(path)}: cannot be read ({error.strerror}); expected {expected}."
        ) from None
    if stat.S_ISDIR(mode):
        if directory:
            return True
        raise ValueError(f"{os.fspath(path)}: is a directory; expected {expected}.")
    if not stat.S_ISREG(mode):
        raise ValueError(f"{os.fspath(path)}: not a regular file ({file_kind(mode)}); expected {expected}.")
    return False


def file_sha256(path: str | os.PathLike[str]) -> str:
    """The hex SHA-256 of the file at ``path``, read 1 MiB at a time (a file larger than memory is fine).

    Example:
        >>> import tempfile
        >>> with tempfile.NamedTemporaryFile(delete=False) as handle:
        ...     _ = handle.write(b"abc")
        >>> file_sha256(handle.name)[:16]
        'ba7816bf8f01cfea'
    """
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
