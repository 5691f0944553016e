"""How a training run continues: the checkpoint it loads, ``trainer.autoresume``, and the one it saves on a signal.

``train`` checks the checkpoint Composer will unpickle (``trainer.load_path``, or the run's latest one with
``trainer.autoresume``) before any rank loads it. When ``SIGINT`` or ``SIGTERM`` stops training,
:func:`save_checkpoint_now` saves the batch reached and :func:`resume_command` is the command line that
continues from it. Every checkpoint records the data it was trained on
(:func:`~composer_dynsample.data.identity.data_identity`), and a resume on other data is refused unless the
config says ``resume_on_changed_data: true``.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

# Only modules that load neither torch nor Composer are imported here; the others are imported in the
# functions that use them, so --help and config errors answer before torch and Composer load.
from composer_dynsample.checkpoints import check_checkpoint
from composer_dynsample.cli.run_dir import RunDirError, is_rank_zero, load_path_override
from composer_dynsample.config.components import ConfigError

__all__ = [
    "autoresume_enabled",
    "checked_load_path",
    "interrupt_message",
    "resume_command",
    "save_checkpoint_now",
]


def checked_load_path(cfg: Any, trust_checkpoint: bool) -> Any:
    """Check ``trainer.load_path`` (a local file) before Composer unpickles it."""
    load_path = cfg.trainer.get("load_path") if "trainer" in cfg else None
    if load_path is not None and "://" not in str(load_path):
        check_checkpoint(load_path, trusted=trust_checkpoint)  # trusted: a regular file, not read
    return load_path


def autoresume_enabled(cfg: Any, run_dir: Path, *, overwrite: bool, trust_checkpoint: bool) -> bool:
    """Whether ``trainer.autoresume`` is on; then check the checkpoint Composer will resume from, if any.

    Composer resumes from ``save_folder/save_latest_filename`` (``RUN_DIR/checkpoints/latest-rank0.pt``
    by default) when that file exists, else it starts afresh (or from ``trainer.load_path``).
    """
    autoresume = cfg.trainer.get("autoresume", False)
    if not isinstance(autoresume, bool):
        raise ConfigError(f"trainer.autoresume must be true or false, got {autoresume!r}.")
    if not autoresume:
        return False
    if overwrite:
        raise RunDirError(
            "--overwrite would remove the checkpoints that trainer.autoresume=true resumes from; drop one: "
            "autoresume continues the run in its --run-dir, --overwrite starts it afresh."
        )
    from composer.utils import format_name_with_dist

    from composer_dynsample.config.run import trainer_defaults

    settings = {**trainer_defaults(run_dir), **cfg.trainer}
    folder, latest = settings.get("save_folder"), settings.get("save_latest_filename", "latest-rank{rank}.pt")
    if folder is None or latest is None or "://" in str(folder):
        return True  # Composer says what is missing; a remote folder is Composer's to download
    run_name = str(settings["run_name"])
    # The default folder is the run directory's, which Composer is given through a path it reads as itself.
    given = "save_folder" in cfg.trainer
    folder = Path(format_name_with_dist(str(folder), run_name) if given else folder)
    path = folder / format_name_with_dist(str(latest), run_name)
    # Composer loads rank 0's file on every rank; rank 0 checks it before any rank can reach the load (the
    # Trainer's process group waits for rank 0, which exits when it refuses).
    if not path.exists():
        return True  # the first attempt: Composer starts afresh (or from trainer.load_path)
    if given and ("#" in str(path) or "?" in str(path)):
        raise RunDirError(
            f"trainer.autoresume cannot resume from {str(path)!r}: Composer reads '#' and '?' in a "
            f"trainer.save_folder as URL syntax. Resume with {load_path_override(path)} instead, or leave "
            "trainer.save_folder to the run directory."
        )
    check_checkpoint(path, trusted=trust_checkpoint)
    return True


def save_checkpoint_now(run: Any) -> str | None:
    """Save a checkpoint of the run now, on every rank; the file this rank wrote, inside the run directory.

    The run's ``save_folder`` takes it (its ``latest-rank0.pt`` then names it, and ``trainer.autoresume``
    continues from it); a run without one (``trainer.save_folder=null``) saves into ``RUN_DIR/checkpoints``.
    """
    trainer = run.trainer
    try:
        trainer.save_checkpoint_to_save_folder()
    except ValueError:  # no save_folder
        folder = (run.composer_run_dir or run.run_dir) / "checkpoints"
        saved = trainer.save_checkpoint(name=str(folder / "ep{epoch}-ba{batch}-rank{rank}.pt"))
        return str(run.local_path(saved)) if saved else None
    saved = trainer.saved_checkpoints if is_rank_zero() else []
    return str(run.local_path(saved[-1])) if saved else None


def resume_command(
    config: str | os.PathLike[str] | Mapping[str, Any],
    overrides: Sequence[str],
    checkpoint: str | os.PathLike[str],
    run_dir: Path,
    world_size: int = 1,
    *,
    quiet: bool = False,
    trust: bool = False,
) -> str:
    """The command line that resumes a run from ``checkpoint`` in ``run_dir``, quoted for a POSIX shell.

    The run's own overrides are kept (a ``trainer.load_path`` among them is replaced) and ``--overwrite`` is
    not repeated: it would remove the checkpoint. The checkpoint's path is YAML-quoted when an override
    would not read it back as it is (``' #'`` starts a YAML comment). For a config given as a mapping there
    is no command line; the answer is then the ``trainer.load_path=...`` override alone.

    Args:
        config (str | os.PathLike | Mapping): The config the run was started with.
        overrides (Sequence[str]): Its overrides.
        checkpoint (str | os.PathLike): The checkpoint to resume from.
        run_dir (Path): The run directory.
        world_size (int): The ranks; more than one gives ``composer -n N -m composer_dynsample``.
            Default: ``1``.
        quiet (bool): Add ``--quiet``. Default: ``False``.
        trust (bool): Add ``--trust-checkpoint``. Default: ``False``.

    Example:
        >>> print(resume_command("a.yaml", ["seed=1"], "runs/a#1/checkpoints/ep1-ba30-rank0.pt", Path("runs/a#1")))
        composer-dynsample train a.yaml seed=1 'trainer.load_path=runs/a#1/checkpoints/ep1-ba30-rank0.pt' --run-dir 'runs/a#1'
    """
    if isinstance(config, Mapping):
        return load_path_override(checkpoint)
    kept = [item for item in overrides if item.split("=", 1)[0].strip() != "trainer.load_path"]
    head = (
        ["composer-dynsample"]
        if world_size == 1
        else ["composer", "-n", str(world_size), "-m", "composer_dynsample"]
    )
    words = [*head, "train", str(config), *kept, load_path_override(checkpoint), "--run-dir", str(run_dir)]
    words += ["--quiet"] * quiet + ["--trust-checkpoint"] * trust
    return shlex.join(words)


def interrupt_message(stop: Any, command: str | None) -> str:
    """What ``train`` says when a signal stopped it: where, the checkpoint saved and the command that resumes.

    Args:
        stop (TrainingInterrupted): What
            :class:`~composer_dynsample.callbacks.checkpoint_on_interrupt.CheckpointOnInterrupt` raised.
        command (str, optional): The resume command (``None`` on ranks that saved no file).
    """
    if stop.checkpoint is None or command is None:
        return f"{stop.where}; rank 0 saved the checkpoint."
    return f"{stop.where}; saved {stop.checkpoint}; resume with: {command}"
