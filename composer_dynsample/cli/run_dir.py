"""The run directory of ``composer-dynsample train``: who may use it, what a previous run left, and clean-up.

One training process at a time owns a run directory: :class:`RunDirLock` holds an exclusive
``fcntl.flock`` on ``RUN_DIR/train.lock`` for the whole run (the operating system releases it when the
process dies, so a lock of a dead process is never in the way) and a second process is refused in one
line naming the first. :func:`prepare_run_dir` refuses a directory that holds a previous run unless told
to replace or resume it, and :class:`RunOutputs` removes what a run that failed before its first
checkpoint wrote, so that the directory does not look like a previous run. Nothing here imports torch.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import shutil
import socket
import sys
from pathlib import Path
from types import TracebackType
from typing import Any

try:
    import fcntl
except ImportError:  # pragma: no cover - not a POSIX system: no lock
    fcntl = None  # type: ignore[assignment]

__all__ = [
    "LOCK_FILENAME",
    "RUN_OUTPUTS",
    "RunDirError",
    "RunDirLock",
    "RunOutputs",
    "checkpoint_note",
    "is_inside",
    "is_rank_zero",
    "latest_checkpoint",
    "load_path_override",
    "prepare_run_dir",
    "run_sources",
]

#: The files and folders a training run writes into its run directory.
RUN_OUTPUTS = (
    "metrics.json",
    "config.yaml",
    "embeddings.png",
    "retrievals.png",
    "checkpoints",
    "eval.json",
    "eval-retrievals.png",
    "tokenizer.json",  # text data: the tokenizer the model was trained with
)

#: The lock file a training run holds in its run directory while it runs (removed when it ends).
LOCK_FILENAME = "train.lock"


class RunDirError(ValueError):
    """The run directory cannot be used: it is under a file, cannot be written, holds a previous run, or
    another training process is using it."""


def is_rank_zero() -> bool:
    """Whether this process is global rank 0, from the launcher's ``RANK`` (no torch import)."""
    return int(os.environ.get("RANK", "0") or 0) == 0


def is_inside(path: Path, folder: Path) -> bool:
    """Whether ``path`` is ``folder`` or inside it, once both are resolved."""
    try:
        path.expanduser().resolve().relative_to(folder.expanduser().resolve())
    except ValueError:
        return False
    return True


def load_path_override(path: str | os.PathLike[str]) -> str:
    """``trainer.load_path=<path>`` as an override that reads back as ``path`` (YAML-quoted when needed).

    Example:
        >>> load_path_override("runs/a/checkpoints/latest-rank0.pt")
        'trainer.load_path=runs/a/checkpoints/latest-rank0.pt'
        >>> load_path_override("runs/it's: here.pt")
        "trainer.load_path='runs/it''s: here.pt'"
    """
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    text = str(path)
    item = f"trainer.load_path={text}"
    try:
        if (
            OmegaConf.to_container(OmegaConf.from_dotlist([item]), resolve=True)["trainer"]["load_path"]
            == text
        ):
            return item
    except (OmegaConfBaseException, ValueError, TypeError, KeyError):
        pass
    return "trainer.load_path='" + text.replace("'", "''") + "'"


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The checkpoint a run directory's run would resume from: ``checkpoints/latest-rank0.pt`` when it
    exists, else the newest ``.pt`` file in ``checkpoints/`` (``None`` when there is none)."""
    folder = run_dir / "checkpoints"
    if (folder / "latest-rank0.pt").is_file():
        return folder / "latest-rank0.pt"
    files = [path for path in folder.glob("*.pt") if path.is_file()] if folder.is_dir() else []
    return max(files, key=lambda path: path.stat().st_mtime) if files else None


def run_sources(
    command: str,
    config: str | None,
    checkpoint: str | os.PathLike[str] | None,
    run: str | None,
    overrides: list[str],
    *,
    needs_checkpoint: bool,
) -> tuple[str | Path, Path | None, list[str]]:
    """The config, checkpoint and overrides of ``eval``, ``embed``, ``export`` or ``mine``: those given, or
    with ``--run RUN_DIR`` the run directory's ``config.yaml`` (the resolved config ``train`` wrote) and its
    :func:`latest_checkpoint`.

    With ``--run`` a first positional holding ``=`` is an override (argparse reads it as CONFIG).

    Raises:
        RunDirError: If ``--run`` comes with CONFIG or ``--checkpoint``, neither CONFIG nor ``--run`` is
            given (or ``--checkpoint`` where ``needs_checkpoint``), the run directory lacks its
            ``config.yaml`` or a checkpoint, or its ``latest-rank0.pt`` links to a file that is gone (one
            line naming what is missing).
    """
    overrides = list(overrides)
    if run is None:
        if config is None:
            given = "--checkpoint CKPT" if needs_checkpoint else "[--checkpoint CKPT]"
            raise RunDirError(
                f"{command} needs CONFIG.yaml {given}, or --run RUN_DIR (a directory train wrote)."
            )
        if needs_checkpoint and checkpoint is None:
            raise RunDirError(
                f"{command} needs the model's checkpoint: add --checkpoint CKPT to {config!r}, or give "
                "--run RUN_DIR instead of the config for a run's latest checkpoint."
            )
        return config, None if checkpoint is None else Path(checkpoint), overrides
    if config is not None and "=" in config:
        overrides.insert(0, config)
        config = None
    if config is not None:
        raise RunDirError(
            f"--run {run!r} reads the run's config.yaml: drop the config {config!r}, or drop --run and give "
            "CONFIG --checkpoint CKPT."
        )
    if checkpoint is not None:
        raise RunDirError(
            f"--run {run!r} takes the run's latest checkpoint: drop --checkpoint {str(checkpoint)!r}, or drop "
            "--run and give CONFIG --checkpoint CKPT."
        )
    folder = Path(run).expanduser()
    if not folder.is_dir():
        what = "is a file, not a directory" if folder.exists() else "no such directory"
        raise RunDirError(f"--run {run!r}: {what}; give the run directory of a train run (its --run-dir).")
    saved = folder / "config.yaml"
    if not saved.is_file():
        raise RunDirError(
            f"--run {run!r} holds no config.yaml (train writes it there as it starts); give the run directory "
            "of a train run, or CONFIG --checkpoint CKPT."
        )
    _check_latest_link(run, folder / "checkpoints")
    found = latest_checkpoint(folder)
    if found is None:
        start = "" if needs_checkpoint else f", or give {str(saved)!r} without --run for the model as built"
        raise RunDirError(
            f"--run {run!r} holds no checkpoint (checkpoints/*.pt): train or resume the run to save one{start}."
        )
    return saved, found, overrides


def _check_latest_link(run: str, folder: Path) -> None:
    """Refuse a run whose ``latest-rank0.pt`` is a link to a file that is gone: the run's latest checkpoint
    is lost, and an older one would be taken in its place without a word.

    Raises:
        RunDirError: Naming the link, its target and the checkpoints left (one line).
    """
    link = folder / "latest-rank0.pt"
    if not link.is_symlink() or link.exists():
        return
    left = sorted(path.name for path in folder.glob("*.pt") if path.is_file())
    others = (
        f"give {str(Path(run) / 'config.yaml')!r} --checkpoint with one of the checkpoints left ({', '.join(left)})"
        if left
        else "train the run again (no other checkpoint is left)"
    )
    raise RunDirError(
        f"--run {run!r}: checkpoints/latest-rank0.pt links to {os.readlink(link)!r}, which does not exist, so the "
        f"run's latest checkpoint is gone; restore that file, or {others}."
    )


def checkpoint_note(run: str, checkpoint: Path) -> str:
    """What to add to a refusal of the checkpoint ``--run`` took: which file it was and what else to give.

    Example:
        >>> checkpoint_note("runs/a", Path("runs/a/checkpoints/latest-rank0.pt"))
        "(the latest checkpoint of --run 'runs/a'; no other checkpoint is left: train the run again)"
    """
    folder = checkpoint.parent
    taken = {checkpoint.name, Path(os.path.realpath(checkpoint)).name}
    left = sorted(
        path.name
        for path in folder.glob("*.pt")
        if path.is_file() and not path.is_symlink() and path.name not in taken
    )
    fix = (
        f"give {str(Path(run) / 'config.yaml')!r} --checkpoint with another of its checkpoints ({', '.join(left)})"
        if left
        else "no other checkpoint is left: train the run again"
    )
    return f"(the latest checkpoint of --run {run!r}; {fix})"


def check_location(run_dir: Path) -> None:
    """Refuse a run directory under a file, or one that is a file, in one line."""
    for parent in (run_dir, *run_dir.parents):
        if parent.exists() and not parent.is_dir():
            raise RunDirError(f"--run-dir {str(run_dir)!r}: {str(parent)!r} is a file, not a directory.")


def prepare_run_dir(
    run_dir: Path, *, overwrite: bool, load_path: Any = None, autoresume: bool = False
) -> None:
    """Refuse a run directory under a file, or one holding a previous run, unless told to replace it.

    A run that resumes from a checkpoint inside ``run_dir``, or with ``autoresume`` (Composer's
    ``trainer.autoresume``: it continues from the run's own latest checkpoint, if any), continues that run
    and may write there. With ``overwrite`` the previous run's outputs (:data:`RUN_OUTPUTS`, nothing else)
    are removed, so no stale checkpoint or plot survives next to the new run's. The refusal names the
    checkpoint that would resume the previous run, as the ``trainer.load_path=...`` to pass.

    Rank 0 alone decides (the other ranks could already see what rank 0 writes for the new run); when it
    refuses it exits, and the launcher (Composer's or ``torchrun``) stops the other ranks.
    """
    if not is_rank_zero():
        return
    check_location(run_dir)
    previous = [name for name in RUN_OUTPUTS if (run_dir / name).exists()]
    if not previous:
        return
    resuming = autoresume or (load_path is not None and is_inside(Path(str(load_path)), run_dir))
    if resuming:
        return
    if not overwrite:
        checkpoint = latest_checkpoint(run_dir)
        resume = f", or resume it with {load_path_override(checkpoint)}" if checkpoint is not None else ""
        raise RunDirError(
            f"{str(run_dir)!r} holds a previous run ({', '.join(previous)}); pass --overwrite to replace it"
            f"{',' if resume else ' or'} choose another --run-dir{resume}."
        )
    for name in previous:
        target = run_dir / name
        shutil.rmtree(target) if target.is_dir() else target.unlink()


def _describe_holder(path: Path) -> str:
    try:
        holder = path.read_text(encoding="utf-8", errors="replace").strip()
    except OSError:
        holder = ""
    return holder or "another process (it has not written its pid yet)"


class RunDirLock:
    """An exclusive lock on a run directory for one training process, held from set-up to exit.

    ``acquire`` creates the directory if needed, then takes ``fcntl.flock`` on ``RUN_DIR/train.lock``
    without waiting: when another process holds it, :class:`RunDirError` names that process (its pid,
    host, start time and command, as it wrote them into the file). The lock belongs to the open file, so
    the operating system releases it when the process dies, however it dies; a lock file left behind by
    a killed process is taken over. ``release`` removes the file. Under many ranks only rank 0 locks
    (rank 0 alone writes the run's files); the others never wait on it.

    Example:
        >>> import tempfile
        >>> with RunDirLock(Path(tempfile.mkdtemp()) / "run") as lock:
        ...     lock.path.name
        'train.lock'
    """

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.path = run_dir / LOCK_FILENAME
        self.created_dir = False
        self._fd: int | None = None

    def acquire(self) -> None:
        """Take the lock (rank 0 only), or raise :class:`RunDirError`."""
        if not is_rank_zero():
            return
        check_location(self.run_dir)
        self.created_dir = not self.run_dir.exists()
        try:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            self._fd = self._lock() if fcntl is not None else None
        except OSError as error:
            raise RunDirError(
                f"--run-dir {str(self.run_dir)!r} cannot be written: {error.strerror or error} "
                f"({type(error).__name__}); choose another --run-dir."
            ) from None
        started = datetime.datetime.now().isoformat(timespec="seconds")
        if self._fd is not None:
            note = f"pid {os.getpid()} on {socket.gethostname()} since {started}: {' '.join(sys.argv)}\n"
            os.ftruncate(self._fd, 0)
            os.write(self._fd, note.encode("utf-8", errors="replace"))

    def _lock(self) -> int:
        """Lock the file the path names now: a file unlinked by a finishing holder is not a lock."""
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                raise RunDirError(
                    f"{str(self.run_dir)!r} is in use by another training run ({_describe_holder(self.path)}); "
                    "wait for it to end, or choose another --run-dir."
                ) from None
            try:
                if os.stat(self.path).st_ino == os.fstat(fd).st_ino:
                    return fd
            except FileNotFoundError:
                pass
            os.close(fd)

    def release(self) -> None:
        """Remove the lock file and release the lock (nothing when this process does not hold it)."""
        if self._fd is None:
            return
        try:
            self.path.unlink(missing_ok=True)
        finally:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> RunDirLock:
        self.acquire()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.release()


class RunOutputs:
    """What a run directory held before a run, to undo a run that failed before its first checkpoint.

    A run that stops before it saved a checkpoint leaves nothing to resume; :meth:`remove_new` then
    removes the outputs it created (:data:`RUN_OUTPUTS` that were not there before: ``config.yaml``, an
    empty ``checkpoints/``) and the directory itself when the run created it and it is left empty, so a
    rerun is not refused as "holds a previous run". A run that saved a checkpoint keeps everything.
    """

    def __init__(self, run_dir: Path, *, created_dir: bool = False) -> None:
        self.run_dir = run_dir
        self.created_dir = created_dir
        self.before = {name for name in RUN_OUTPUTS if (run_dir / name).exists()}
        self.checkpoints_before = self._checkpoints()

    def _checkpoints(self) -> set[str]:
        folder = self.run_dir / "checkpoints"
        return {path.name for path in folder.iterdir()} if folder.is_dir() else set()

    def saved_checkpoint(self) -> bool:
        """Whether a checkpoint file appeared in ``checkpoints/`` since the run started."""
        return bool(self._checkpoints() - self.checkpoints_before)

    def remove_new(self) -> None:
        """Remove the outputs this run created, unless it saved a checkpoint (rank 0 only); the directory
        itself goes with :meth:`remove_empty_dir`, once the lock in it is released."""
        if not is_rank_zero() or self.saved_checkpoint():
            return
        for name in RUN_OUTPUTS:
            target = self.run_dir / name
            if name in self.before or not (target.exists() or target.is_symlink()):
                continue
            shutil.rmtree(target, ignore_errors=True) if target.is_dir() else target.unlink(missing_ok=True)

    def remove_empty_dir(self) -> None:
        """Remove the run directory when this run created it and it is empty (after the lock is released)."""
        if self.created_dir and is_rank_zero() and not self.saved_checkpoint():
            with contextlib.suppress(OSError):
                self.run_dir.rmdir()  # only when empty
