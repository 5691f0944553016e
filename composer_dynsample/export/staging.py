"""The atomic write of an export folder: staged beside ``out_dir``, renamed to it when whole.

An export writes into a new folder beside ``out_dir`` (:func:`staged`) and renames it to ``out_dir`` at
the end: a failed export leaves nothing behind, never a part of a model, nor the parent folders made for
it. Every file written is readable as any new file is (:func:`new_file_modes`: ``0o666`` less the umask;
``safetensors`` alone would leave its weights ``0o600``).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

__all__ = ["new_file_modes", "prepare_dir", "staged"]


def _checked_out_dir(out_dir: str | os.PathLike[str]) -> Path:
    """``out_dir`` as a path, when it is new or an empty directory."""
    directory = Path(out_dir).expanduser()
    if directory.exists() and (not directory.is_dir() or any(directory.iterdir())):
        raise ValueError(f"out_dir {str(out_dir)!r} exists and is not an empty directory; choose a new one.")
    return directory


def prepare_dir(out_dir: str | os.PathLike[str]) -> Path:
    """``out_dir``, made (with its parents) when it is new.

    Raises:
        ValueError: If ``out_dir`` exists and is not an empty directory.
    """
    directory = _checked_out_dir(out_dir)
    directory.mkdir(parents=True, exist_ok=True)
    return directory


def _umask() -> int:
    umask = os.umask(0o022)
    os.umask(umask)  # reading the umask sets it: set it back at once
    return umask


@contextlib.contextmanager
def staged(out_dir: str | os.PathLike[str]) -> Iterator[Path]:
    """A new folder beside ``out_dir`` to write the export into: renamed to ``out_dir`` when the block ends
    without an error, removed with what it holds otherwise (and the folders made for it), so that
    ``out_dir`` is either the whole export or not there.

    Raises:
        ValueError: If ``out_dir`` exists and is not an empty directory.

    Example:
        >>> import tempfile
        >>> out = Path(tempfile.mkdtemp()) / "new" / "model"
        >>> with staged(out) as folder:
        ...     _ = (folder / "weights.bin").write_bytes(b"0")
        >>> sorted(path.name for path in out.iterdir())
        ['weights.bin']
    """
    directory = _checked_out_dir(out_dir)
    made = [parent for parent in directory.parents if not parent.exists()]
    directory.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{directory.name}.partial-", dir=directory.parent))
    try:
        yield staging
        staging.chmod(0o777 & ~_umask())  # mkdtemp's folder is private
        if directory.exists():
            directory.rmdir()  # empty, as checked
        staging.rename(directory)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        for parent in made:  # the deepest first
            with contextlib.suppress(OSError):
                parent.rmdir()
        raise


def new_file_modes(directory: Path) -> None:
    """Give every file under ``directory`` the mode of a newly created file: ``0o666`` less the umask."""
    umask = _umask()
    for path in directory.rglob("*"):
        if path.is_file() and not path.is_symlink():
            path.chmod(0o666 & ~umask)
