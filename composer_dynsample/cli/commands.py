"""What the ``composer-dynsample`` commands do: train a config, evaluate (a checkpoint or the model as built),
and what the commands that read a checkpoint share (``embed``, ``mine`` and ``export`` have modules of their
own beside this one).

Each function takes a config (file or mapping) and dotted overrides, builds the run with
:func:`composer_dynsample.config.build_run`, and writes its results into a run directory. The command
line (:mod:`composer_dynsample.cli.main`) parses arguments and turns the errors raised here into one line.
What ``train`` does with the built run (the fit, the final evaluation, the report) is in
:mod:`composer_dynsample.cli.training`.
"""

from __future__ import annotations

import functools
import os
import sys
import time
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

# Only modules that load neither torch nor Composer are imported here; the others are imported in the
# functions that use them, so --help and config errors answer before torch and Composer load.
from composer_dynsample.checkpoints import check_checkpoint
from composer_dynsample.cli import training
from composer_dynsample.cli.resume import (
    autoresume_enabled,
    checked_load_path,
    resume_command,
    save_checkpoint_now,
)
from composer_dynsample.cli.run_dir import (
    RUN_OUTPUTS,
    RunDirError,
    RunDirLock,
    RunOutputs,
    is_rank_zero,
    prepare_run_dir,
)
from composer_dynsample.cli.training import Interrupted, evaluate_run, fit_and_report, plot_run_retrievals
from composer_dynsample.config.checks import check_config
from composer_dynsample.config.loading import (
    default_run_dir,
    expand_trainer_paths,
    load_config,
    section,
)
from composer_dynsample.config.ranks import check_same_config_on_every_rank

__all__ = [
    "RUN_OUTPUTS",
    "START_EVAL_FILE",
    "Interrupted",
    "OutputError",
    "RunDirError",
    "evaluate",
    "evaluate_run",
    "prepare_run_dir",
    "set_cpu_threads",
    "train",
]


class OutputError(ValueError):
    """An ``--out`` path cannot be written: it is a directory (a non-empty one, for ``export``), under a
    file, or in a folder that cannot be written in."""


def set_cpu_threads() -> int | None:
    """Pick torch's intra-op thread count when ``OMP_NUM_THREADS`` does not say it; return what was set.

    Each process gets ``cores // local ranks`` threads, at most 1 when that leaves fewer than 4: the
    models of metric-learning recipes are small, and on a machine of a few cores that is also busy with
    other work, threads that wait for a core spin in OpenMP barriers (the digits recipe trained 11-18x
    slower with 2 threads than with 1 on a busy 2-core machine; ``benchmarks/threads.py`` measures it).
    ``torchrun`` sets ``OMP_NUM_THREADS=1`` per rank itself; Composer's launcher does not, and N ranks
    with all cores each oversubscribe the CPU. Set ``OMP_NUM_THREADS`` to choose yourself.
    """
    if os.environ.get("OMP_NUM_THREADS"):
        return None
    import torch

    local_ranks = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1))
    share = max(1, (os.cpu_count() or 1) // local_ranks)
    threads = share if share >= 4 else 1
    torch.set_num_threads(threads)
    return threads


def _out_path(
    out: str | os.PathLike[str],
    example: str = "",
    suffix: str | None = None,
    *,
    directory: bool = False,
    overwrite: bool | None = None,
) -> Path:
    """The file an ``--out`` names (``suffix`` appended when missing), or with ``directory`` the new or
    empty folder it names: checked before anything is loaded. ``overwrite=False`` also refuses an existing
    file (a command with ``--overwrite``); ``None`` does not check.

    Raises:
        OutputError: If the file is a directory, exists without ``overwrite``, the folder exists and is not
            an empty directory, a parent is a file, or the nearest existing folder cannot be written in
            (``os.access``).
    """
    given = Path(out).expanduser()
    path = given if suffix is None or given.suffix == suffix else given.with_name(given.name + suffix)
    if directory and path.exists() and (not path.is_dir() or any(path.iterdir())):
        raise OutputError(f"--out {str(out)!r} exists and is not an empty directory; choose a new one.")
    for candidate in dict.fromkeys((given, path)):
        if not directory and candidate.is_dir():
            raise OutputError(
                f"--out {str(candidate)!r} is a directory; give a file name, e.g. {str(candidate / example)!r}."
            )
    if overwrite is False and not directory and (path.exists() or path.is_symlink()):
        raise OutputError(
            f"--out {str(path)!r} exists; pass --overwrite to replace it, or choose a new file."
        )
    for parent in path.parents:
        if parent.exists() and not parent.is_dir():
            raise OutputError(f"--out {str(path)!r}: {str(parent)!r} is a file, not a directory.")
    start = path if directory else path.parent
    existing = next(folder for folder in (start, *start.parents) if folder.exists())
    if not os.access(existing, os.W_OK | os.X_OK):
        raise OutputError(
            f"--out {str(path)!r}: the folder {str(existing)!r} is not writable (permission denied); "
            "choose a folder you can write in."
        )
    return path


def _prepare(
    config: str | os.PathLike[str] | Mapping[str, Any],
    overrides: Sequence[str],
    run_dir: str | os.PathLike[str] | None,
    *,
    quiet: bool,
    trust_checkpoint: bool,
    settings: Mapping[str, Any] | None = None,
) -> tuple[Any, Path | None, Path, Any]:
    """Load the config and check it and any checkpoint: ``(cfg, config path, run directory, load_path)``.

    Nothing on disk changes here; ``settings`` (``{"trainer.load_path": path}``) are set by :func:`_load`.
    """
    config_path = None if isinstance(config, Mapping) else Path(config)
    cfg = _load(config, overrides, settings or {})
    _check_config(cfg)
    _local_defaults(cfg, quiet)
    directory = _run_directory(cfg, run_dir, config_path)
    return cfg, config_path, directory, checked_load_path(cfg, trust_checkpoint)


def _load(
    config: str | os.PathLike[str] | Mapping[str, Any], overrides: Sequence[str], settings: Mapping[str, Any]
) -> Any:
    """The config with its ``overrides`` applied, then ``settings`` set as they are: unlike an override, a
    value is not parsed as YAML (a path may hold ``#`` or ``: ``). Rank 0 prints the overrides' notes on stderr."""
    from omegaconf import OmegaConf

    note = functools.partial(print, file=sys.stderr) if is_rank_zero() else None  # one copy of each note
    cfg = load_config(config, overrides, note=note)
    for key, value in settings.items():
        head = key.split(".", 1)[0]
        section(cfg, head, head)  # a section that is not a mapping is a ConfigError, not OmegaConf's
        OmegaConf.update(cfg, key, value, merge=False)
    return cfg


def _check_config(cfg: Any) -> None:
    """Check the whole config before anything on disk changes (``--overwrite`` removes a previous run):
    the cheap checks of every section, ``seed`` and ``run_dir`` first (no data loaded, at most torch
    imported; :func:`~composer_dynsample.config.checks.check_config`), then that every rank was given the
    same config."""
    check_config(cfg)
    check_same_config_on_every_rank(cfg)


def _local_defaults(cfg: Any, quiet: bool) -> None:
    """Set what may differ between ranks, once every rank's config is checked to be the same: no progress
    bar when asked or when stdout is not a terminal (unless the config sets one), ``~`` expanded in the
    trainer's local paths."""
    if quiet:
        cfg.trainer.progress_bar = False
    elif "progress_bar" not in cfg.trainer:
        cfg.trainer.progress_bar = sys.stdout.isatty()
    expand_trainer_paths(cfg.trainer)


def _run_directory(cfg: Any, run_dir: str | os.PathLike[str] | None, config_path: Path | None) -> Path:
    """The run directory: ``run_dir`` if given, else the config's ``run_dir``, else ``runs/<config stem>``."""
    return Path(run_dir or cfg.get("run_dir") or default_run_dir(config_path)).expanduser()


def _build(cfg: Any, directory: Path, callbacks: Sequence[Any] = ()) -> Any:
    """Choose the CPU threads and build the run (Composer and torch are imported here)."""
    threads = set_cpu_threads()
    if threads is not None and is_rank_zero():
        print(f"torch: {threads} intra-op thread(s) per process (OMP_NUM_THREADS unset; set it to choose)")
    from composer_dynsample.config.matryoshka import check_dims_fit
    from composer_dynsample.config.run import build_run

    run = build_run(cfg, directory, callbacks=callbacks)
    check_dims_fit(run.config, run.model)  # before the first step: the width is the built model's
    return run


def train(
    config: str | os.PathLike[str] | Mapping[str, Any],
    overrides: Sequence[str] = (),
    run_dir: str | os.PathLike[str] | None = None,
    *,
    overwrite: bool = False,
    trust_checkpoint: bool = False,
    quiet: bool = False,
) -> dict[str, Any]:
    """Build a run from a config, train it, evaluate it (with ``evaluation.at_start`` its start too), report it.

    Every rank builds and trains; rank 0 alone writes ``RUN_DIR/config.yaml`` (once the Trainer is
    built), ``metrics.json`` and (except for text pairs) ``embeddings.png`` and prints the metrics
    table. Checkpoints go to ``RUN_DIR/checkpoints`` (Composer's ``save_folder``); ``trainer.load_path`` resumes from one, after
    :func:`~composer_dynsample.checkpoints.check_checkpoint` unless ``trust_checkpoint``, and
    ``trainer.autoresume=true`` continues the run in ``run_dir`` from its latest one, when there is one.

    The whole config is checked before a previous run is removed (``overwrite``). Rank 0 holds a lock on
    the run directory for the whole run (:class:`~composer_dynsample.cli.run_dir.RunDirLock`): a second
    ``train`` on it is refused. A run that fails before its first checkpoint removes what it wrote. On
    ``SIGINT`` (Ctrl-C) or ``SIGTERM`` every rank saves a checkpoint at the next batch end and
    :class:`Interrupted` says the command that resumes it.

    Args:
        config (str | os.PathLike | Mapping): A YAML file or the config itself.
        overrides (Sequence[str]): Dotted ``key.path=value`` overrides. Default: none.
        run_dir (str | os.PathLike, optional): The output directory. Default: the config's ``run_dir``,
            else ``runs/<config file stem>``.
        overwrite (bool): Replace a previous run in ``run_dir``. Default: ``False`` (refuse).
        trust_checkpoint (bool): Load ``trainer.load_path`` without checking it first. Default: ``False``.
        quiet (bool): No progress bar, no progress lines and no metrics table. Default: ``False``.

    Returns:
        dict[str, Any]: What ``metrics.json`` holds (the same on every rank).

    Raises:
        ConfigError: If the config is wrong, or a resumed run has nothing left to train.
        CheckpointError: If ``trainer.load_path`` is unsafe or broken.
        RunDirError: If the run directory cannot be used, or another ``train`` is using it.
        Interrupted: If a signal stopped training (a checkpoint was saved).
    """
    started = time.perf_counter()
    cfg, config_path, directory, load_path = _prepare(
        config, overrides, run_dir, quiet=quiet, trust_checkpoint=trust_checkpoint
    )
    autoresume = autoresume_enabled(cfg, directory, overwrite=overwrite, trust_checkpoint=trust_checkpoint)
    lock = RunDirLock(directory)
    lock.acquire()
    outputs = None
    try:
        prepare_run_dir(directory, overwrite=overwrite, load_path=load_path, autoresume=autoresume)
        outputs = RunOutputs(directory, created_dir=lock.created_dir)
        from composer_dynsample.callbacks.checkpoint_on_interrupt import CheckpointOnInterrupt

        interrupt = CheckpointOnInterrupt()
        run = _build(cfg, directory, callbacks=[interrupt, training.start_metrics_keeper()])
        interrupt.save = functools.partial(save_checkpoint_now, run)
        resume = functools.partial(resume_command, config, overrides, quiet=quiet, trust=trust_checkpoint)
        metrics = fit_and_report(run, interrupt, resume, config_path, overrides, started, quiet=quiet)
        outputs = None  # the run is complete: nothing to undo
        return metrics
    finally:
        if outputs is not None:
            outputs.remove_new()  # keeps everything when a checkpoint was saved (an interrupted run)
        lock.release()
        if outputs is not None:
            outputs.remove_empty_dir()


_TRUNCATION_REPORT = r".* longer than max_length=\d+ tokens and were truncated"


#: The json ``eval`` writes in the run directory for the model as built: not a checkpoint's ``eval.json``.
START_EVAL_FILE = "eval-start.json"


def _prepare_model_run(
    config: str | os.PathLike[str] | Mapping[str, Any],
    checkpoint: str | os.PathLike[str] | None,
    overrides: Sequence[str],
    trust_checkpoint: bool,
) -> tuple[Any, Path]:
    """The checked config and run directory of a run that only embeds, with the checkpoint's weights
    (``None``: the model as built; ``trainer.load_path`` and ``autoresume`` ignored) and nothing saved.

    Raises:
        CheckpointError: If ``checkpoint`` is unsafe or broken.
        ConfigError: If the config is wrong.
    """
    if checkpoint is not None:
        check_checkpoint(checkpoint, trusted=trust_checkpoint)
    settings: dict[str, Any] = {
        "trainer.load_path": None if checkpoint is None else str(Path(checkpoint).expanduser()),
        **({"trainer.load_weights_only": True} if checkpoint is not None else {}),
        "trainer.autoresume": False,  # the config's autoresume would load the run's latest checkpoint instead
        "trainer.save_folder": None,
        "evaluation.interval": None,
        "evaluation.at_start": False,
    }
    cfg, _, directory, _ = _prepare(
        config, overrides, None, quiet=True, trust_checkpoint=True, settings=settings
    )
    return cfg, directory


def _build_model_run(cfg: Any, directory: Path, *, trained: bool = True) -> Any:
    """Build a run of :func:`_prepare_model_run` (for eval, embed and export); texts' truncation is told
    unless ``trained`` (train told it)."""
    with warnings.catch_warnings():
        if trained:
            warnings.filterwarnings("ignore", message=_TRUNCATION_REPORT, category=UserWarning)
        return _build(cfg, directory)


def evaluate(
    config: str | os.PathLike[str] | Mapping[str, Any],
    checkpoint: str | os.PathLike[str] | None = None,
    overrides: Sequence[str] = (),
    *,
    out: str | os.PathLike[str] | None = None,
    trust_checkpoint: bool = False,
) -> dict[str, Any]:
    """Score a saved checkpoint, or the model as built, on the test split by the data's protocol, as
    ``train`` does at its end (and at its start with ``evaluation.at_start``).

    Without a checkpoint the model is the one the config builds before training (a pretrained folder's
    weights, or the random initialisation of its ``seed``: the model ``train`` starts from); the config's
    ``trainer.load_path`` and ``trainer.autoresume`` are ignored. Nothing is trained or checkpointed.
    For image data the test queries' nearest test items are drawn beside the json: ``retrievals.png``,
    or in the run directory ``<json stem>-retrievals.png`` (its ``retrievals.png`` is the training run's).

    Args:
        config (str | os.PathLike | Mapping): The config (the one the checkpoint was trained with).
        checkpoint (str | os.PathLike, optional): The checkpoint file. Default: ``None`` (the model as built).
        overrides (Sequence[str]): Dotted overrides (e.g. ``evaluation.ks=[1,10]``). Default: none.
        out (str | os.PathLike, optional): Where to write the metrics as JSON. Default: ``eval.json``
            beside the checkpoint's ``checkpoints`` folder (the run directory); without a checkpoint
            :data:`START_EVAL_FILE` in the config's run directory (``run_dir``, else ``runs/<config stem>``).
        trust_checkpoint (bool): Skip the safety check of the file. Default: ``False``.

    Returns:
        dict[str, Any]: The metrics, the checkpoint (``None`` without one) and the test split's name.

    Raises:
        OutputError: If ``out`` is a directory or under a file, or the run's own ``metrics.json`` or
            ``config.yaml`` (before the data are loaded).
        ConfigError: If the config is wrong.
        CheckpointError: If ``checkpoint`` is unsafe, broken, or does not fit the config's model.
    """
    prepared = None
    if checkpoint is None:
        prepared = _prepare_model_run(config, None, overrides, trust_checkpoint)
        run_dir, name = prepared[1], START_EVAL_FILE
    else:
        run_dir, name = _run_dir_of(Path(checkpoint)), "eval.json"
    path = _out_path(out if out is not None else run_dir / name, "eval.json")
    same_dir = path.parent.expanduser().resolve() == run_dir.expanduser().resolve()
    if same_dir and path.name in _RUN_RECORDS:  # what train wrote: the run's record, not eval's to replace
        raise OutputError(
            f"--out {str(path)!r} is the {path.name} train wrote for this run; give another file (the default, "
            f"{name}, beside it)."
        )
    plot = path.with_name(f"{path.stem}-retrievals.png" if same_dir else "retrievals.png")
    if prepared is None:
        prepared = _prepare_model_run(config, checkpoint, overrides, trust_checkpoint)
    run = _build_model_run(*prepared, trained=checkpoint is not None)
    final, test_embeddings = evaluate_run(run)
    given = None if checkpoint is None else str(checkpoint)
    result = {**final, "checkpoint": given, "dataset": run.splits.test_name}
    if is_rank_zero():
        model = Path(checkpoint).name if checkpoint is not None else "the model as built (no checkpoint)"
        plot_run_retrievals(run, test_embeddings, plot, model)
        training.report_evaluation(run, result, path, model)
    return result


#: The files ``train`` writes into a run directory that ``eval --out`` must not replace.
_RUN_RECORDS = ("metrics.json", "config.yaml")


def _run_dir_of(checkpoint: Path) -> Path:
    # os.path.realpath, unlike Path.resolve, does not raise on a symlink loop: check_checkpoint names it
    folder = Path(os.path.realpath(checkpoint.expanduser())).parent
    return folder.parent if folder.name == "checkpoints" else folder
