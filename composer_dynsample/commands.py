"""What the ``composer-dynsample`` commands do: train a config, evaluate or embed with a checkpoint.

Each function takes a config (file or mapping) and dotted overrides, builds the run with
:func:`composer_dynsample.config.build_run`, and writes its results into a run directory. The command
line (:mod:`composer_dynsample.cli`) parses arguments and turns the errors raised here into one line.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "RUN_OUTPUTS",
    "OutputError",
    "RunDirError",
    "embed",
    "evaluate",
    "evaluate_run",
    "prepare_run_dir",
    "set_cpu_threads",
    "train",
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
)


class RunDirError(ValueError):
    """The run directory cannot be used: it is under a file, or holds a previous run."""


class OutputError(ValueError):
    """An ``--out`` path cannot be written: it is a directory, or under a file."""


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


def prepare_run_dir(
    run_dir: Path, *, overwrite: bool, load_path: Any = None, autoresume: bool = False
) -> None:
    """Refuse a run directory under a file, or one holding a previous run, unless told to replace it.

    A run that resumes from a checkpoint inside ``run_dir``, or with ``autoresume`` (Composer's
    ``trainer.autoresume``: it continues from the run's own latest checkpoint, if any), continues that run
    and may write there. With ``overwrite`` the previous run's outputs (:data:`RUN_OUTPUTS`, nothing else)
    are removed, so no stale checkpoint or plot survives next to the new run's.

    Rank 0 alone decides (the other ranks could already see what rank 0 writes for the new run); when it
    refuses it exits, and the launcher (Composer's or ``torchrun``) stops the other ranks.
    """
    if not _is_rank_zero():
        return
    for parent in (run_dir, *run_dir.parents):
        if parent.exists() and not parent.is_dir():
            raise RunDirError(f"--run-dir {str(run_dir)!r}: {str(parent)!r} is a file, not a directory.")
    previous = [name for name in RUN_OUTPUTS if (run_dir / name).exists()]
    if not previous:
        return
    resuming = autoresume or (load_path is not None and _is_inside(Path(str(load_path)), run_dir))
    if resuming:
        return
    if not overwrite:
        raise RunDirError(
            f"{str(run_dir)!r} holds a previous run ({', '.join(previous)}); pass --overwrite to replace it, "
            "choose another --run-dir, or resume it with trainer.load_path=<its checkpoint>."
        )
    for name in previous:
        target = run_dir / name
        shutil.rmtree(target) if target.is_dir() else target.unlink()


def _is_inside(path: Path, folder: Path) -> bool:
    try:
        path.expanduser().resolve().relative_to(folder.expanduser().resolve())
    except ValueError:
        return False
    return True


def _is_rank_zero() -> bool:
    return int(os.environ.get("RANK", "0") or 0) == 0


def _checked_load_path(cfg: Any, trust_checkpoint: bool) -> Any:
    """Check ``trainer.load_path`` (a local file) before Composer unpickles it."""
    from composer_dynsample.checkpoints import check_checkpoint

    load_path = cfg.trainer.get("load_path") if "trainer" in cfg else None
    if load_path is not None and "://" not in str(load_path):
        check_checkpoint(load_path, trusted=trust_checkpoint)  # trusted: a regular file, not read
    return load_path


def _autoresume(cfg: Any, run_dir: Path, *, overwrite: bool, trust_checkpoint: bool) -> bool:
    """Whether ``trainer.autoresume`` is on; then check the checkpoint Composer will resume from, if any.

    Composer resumes from ``save_folder/save_latest_filename`` (``RUN_DIR/checkpoints/latest-rank0.pt``
    by default) when that file exists, else it starts afresh (or from ``trainer.load_path``).
    """
    from composer_dynsample.config.registry import ConfigError

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

    from composer_dynsample.checkpoints import check_checkpoint
    from composer_dynsample.config.run import trainer_defaults

    settings = {**trainer_defaults(run_dir), **cfg.trainer}
    folder, latest = settings.get("save_folder"), settings.get("save_latest_filename", "latest-rank{rank}.pt")
    if folder is None or latest is None or "://" in str(folder):
        return True  # Composer says what is missing; a remote folder is Composer's to download
    run_name = str(settings["run_name"])
    path = Path(format_name_with_dist(str(folder), run_name)) / format_name_with_dist(str(latest), run_name)
    # Composer loads rank 0's file on every rank; rank 0 checks it before any rank can reach the load (the
    # Trainer's process group waits for rank 0, which exits when it refuses).
    if not path.exists():
        return True  # the first attempt: Composer starts afresh (or from trainer.load_path)
    if "#" in str(path) or "?" in str(path):
        raise RunDirError(
            f"trainer.autoresume cannot resume from {str(path)!r}: Composer reads '#' and '?' in a path as "
            "URL syntax. Resume with trainer.load_path=<that checkpoint> instead, or use a --run-dir without them."
        )
    check_checkpoint(path, trusted=trust_checkpoint)
    return True


def _out_path(out: str | os.PathLike[str], example: str, suffix: str | None = None) -> Path:
    """The file an ``--out`` names (``suffix`` appended when missing), or an :class:`OutputError`."""
    given = Path(out).expanduser()
    path = given if suffix is None or given.suffix == suffix else given.with_name(given.name + suffix)
    for candidate in dict.fromkeys((given, path)):
        if candidate.is_dir():
            raise OutputError(
                f"--out {str(candidate)!r} is a directory; give a file name, e.g. {str(candidate / example)!r}."
            )
    for parent in path.parents:
        if parent.exists() and not parent.is_dir():
            raise OutputError(f"--out {str(path)!r}: {str(parent)!r} is a file, not a directory.")
    return path


def _quiet_defaults(cfg: Any, quiet: bool) -> None:
    """No progress bar when asked, or when stdout is not a terminal (unless the config sets one)."""
    if quiet:
        cfg.trainer.progress_bar = False
    elif "progress_bar" not in cfg.trainer:
        cfg.trainer.progress_bar = sys.stdout.isatty()


def _check_duration_left(run: Any) -> None:
    """A resumed run whose checkpoint already reached ``max_duration``: say what to raise, in one line."""
    from composer_dynsample.config import ConfigError

    state = run.trainer.state
    duration = state.max_duration
    elapsed = int(state.timestamp.get(duration.unit))
    if int(duration.value) <= elapsed:
        raise ConfigError(
            f"the checkpoint has already trained {elapsed}{duration.unit.value} and trainer.max_duration is "
            f"{duration}: nothing is left to train. Raise trainer.max_duration (e.g. "
            f"trainer.max_duration={elapsed + max(1, int(duration.value) // 2)}{duration.unit.value}) to continue."
        )


def evaluate_run(run: Any) -> tuple[dict[str, float], Any]:
    """Embed the test queries and the train gallery with the run's current model and score them.

    When the run's test split is scored leave-one-out (``run.leave_one_out``: its classes are not in the
    train split) every test item queries the other test items instead. Every rank computes the same
    result: the queries and gallery are whole on each rank, and rank 0's buffers are broadcast first.

    Args:
        run (TrainingRun): A run from :func:`composer_dynsample.config.build_run`.

    Returns:
        tuple[dict[str, float], torch.Tensor]: ``recall_at_{k}`` per ``k``, ``map_at_r`` and
        ``r_precision`` of the test queries against the train gallery, ``queries_without_positive`` of
        ``num_queries`` (the queries every metric leaves out), and the test embeddings.
    """
    from composer_dynsample.callbacks.retrieval_gallery import embed_store
    from composer_dynsample.distributed import broadcast_buffers
    from composer_dynsample.metrics import count_queries_without_positive, retrieval_metrics

    model = run.trainer.state.model
    broadcast_buffers(model)  # every rank evaluates rank 0's model (BatchNorm statistics differ per rank)
    queries = embed_store(model, run.splits.test)
    gallery, gallery_labels = None, None
    if not getattr(run, "leave_one_out", False):
        gallery = embed_store(model, run.splits.train)
        gallery_labels = run.splits.train.labels.to(gallery.device)
    labels = run.splits.test.labels.to(queries.device)
    values = retrieval_metrics(queries, labels, gallery, gallery_labels, ks=run.ks, distance=run.distance)
    result: dict[str, float] = {name: float(value) for name, value in values.items()}
    result["queries_without_positive"] = count_queries_without_positive(labels, gallery_labels)
    result["num_queries"] = len(labels)
    return result, queries.cpu()


def _build(
    config: str | os.PathLike[str] | Mapping[str, Any],
    overrides: Sequence[str],
    run_dir: str | os.PathLike[str] | None,
    *,
    quiet: bool,
    trust_checkpoint: bool,
    overwrite: bool | None,
    settings: Mapping[str, Any] | None = None,
) -> tuple[Any, Path | None]:
    """Load the config, check it, any checkpoint and the run directory, and build the run.

    ``settings`` (``{"trainer.load_path": path}``) are set on the loaded config as they are, after the
    overrides: unlike an override, a value is not parsed as YAML (a path may hold ``#`` or ``: ``).
    """
    from omegaconf import OmegaConf

    from composer_dynsample.config.builders import check_config
    from composer_dynsample.config.loading import (
        default_run_dir,
        expand_trainer_paths,
        load_config,
        run_options,
        section,
    )

    config_path = None if isinstance(config, Mapping) else Path(config)
    cfg = load_config(config, overrides)
    for key, value in (settings or {}).items():
        head = key.split(".", 1)[0]
        section(cfg, head, head)  # a section that is not a mapping is a ConfigError, not OmegaConf's
        OmegaConf.update(cfg, key, value, merge=False)
    run_options(cfg)  # seed and run_dir are checked before torch and Composer are imported
    # The whole config is checked before anything on disk changes (--overwrite removes a previous run):
    # the cheap checks, no data loaded, at most torch imported.
    check_config(cfg)
    from composer_dynsample.config.ranks import check_same_config_on_every_rank

    check_same_config_on_every_rank(cfg)  # before the per-rank defaults below, and before any rank writes
    _quiet_defaults(cfg, quiet)
    expand_trainer_paths(cfg.trainer)
    directory = Path(run_dir or cfg.get("run_dir") or default_run_dir(config_path)).expanduser()
    load_path = _checked_load_path(cfg, trust_checkpoint)
    if overwrite is not None:
        autoresume = _autoresume(cfg, directory, overwrite=overwrite, trust_checkpoint=trust_checkpoint)
        prepare_run_dir(directory, overwrite=overwrite, load_path=load_path, autoresume=autoresume)
    threads = set_cpu_threads()
    if threads is not None and _is_rank_zero():
        print(f"torch: {threads} intra-op thread(s) per process (OMP_NUM_THREADS unset; set it to choose)")
    from composer_dynsample.config.run import build_run  # Composer and torch, once the config reads well

    return build_run(cfg, directory), config_path


def train(
    config: str | os.PathLike[str] | Mapping[str, Any],
    overrides: Sequence[str] = (),
    run_dir: str | os.PathLike[str] | None = None,
    *,
    overwrite: bool = False,
    trust_checkpoint: bool = False,
    quiet: bool = False,
) -> dict[str, Any]:
    """Build a run from a config, train it, evaluate it and write its report.

    Every rank builds and trains; rank 0 alone writes ``RUN_DIR/config.yaml`` (before training),
    ``metrics.json`` and ``embeddings.png`` and prints the metrics table. Checkpoints go to
    ``RUN_DIR/checkpoints`` (Composer's ``save_folder``); ``trainer.load_path`` resumes from one, after
    :func:`~composer_dynsample.checkpoints.check_checkpoint` unless ``trust_checkpoint``, and
    ``trainer.autoresume=true`` continues the run in ``run_dir`` from its latest one, when there is one.
    The whole config is checked before a previous run is removed (``overwrite``).

    Args:
        config (str | os.PathLike | Mapping): A YAML file or the config itself.
        overrides (Sequence[str]): Dotted ``key.path=value`` overrides. Default: none.
        run_dir (str | os.PathLike, optional): The output directory. Default: the config's ``run_dir``,
            else ``runs/<config file stem>``.
        overwrite (bool): Replace a previous run in ``run_dir``. Default: ``False`` (refuse).
        trust_checkpoint (bool): Load ``trainer.load_path`` without checking it first. Default: ``False``.
        quiet (bool): No progress bar and no metrics table. Default: ``False``.

    Returns:
        dict[str, Any]: What ``metrics.json`` holds (the same on every rank).

    Raises:
        ConfigError: If the config is wrong, or a resumed run has nothing left to train.
        CheckpointError: If ``trainer.load_path`` is unsafe or broken.
        RunDirError: If the run directory cannot be used.
    """
    from composer_dynsample.config.loading import save_config

    started = time.perf_counter()
    run, config_path = _build(
        config, overrides, run_dir, quiet=quiet, trust_checkpoint=trust_checkpoint, overwrite=overwrite
    )
    from composer.utils import dist

    _check_duration_left(run)
    if dist.get_global_rank() == 0:
        save_config(run.config, run.run_dir / "config.yaml")
    state = run.trainer.state
    start_batch, start_epoch = int(state.timestamp.batch), int(state.timestamp.epoch)
    fit_start = time.perf_counter()
    run.trainer.fit()
    fit_seconds = time.perf_counter() - fit_start
    final, test_embeddings = evaluate_run(run)
    run.trainer.logger.log_metrics({f"final/{name}": value for name, value in final.items()})
    metrics = {
        **final,
        "wall_time_s": round(fit_seconds, 3),
        "total_time_s": round(time.perf_counter() - started, 3),
        **_run_record(run, config_path, overrides, start_epoch=start_epoch, start_batch=start_batch),
    }
    if dist.get_global_rank() == 0:
        _report(run, metrics, final, test_embeddings, quiet=quiet)
    run.trainer.close()
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()
    return metrics


def _run_record(
    run: Any, config_path: Path | None, overrides: Sequence[str], *, start_epoch: int, start_batch: int
) -> dict[str, Any]:
    """What ``metrics.json`` says about the run besides its metrics and times."""
    from composer.utils import dist

    state = run.trainer.state
    saved = [str(path) for path in getattr(run.trainer, "saved_checkpoints", [])]
    return {
        "seed": run.seed,
        "epochs": int(state.timestamp.epoch),
        "batches": int(state.timestamp.batch),
        "epochs_this_run": int(state.timestamp.epoch) - start_epoch,
        "resumed_from_epoch": start_epoch,
        "resumed_from_batch": start_batch,
        "max_duration": str(run.config.trainer.max_duration),
        "config": str(config_path) if config_path is not None else None,
        "overrides": list(overrides),
        "run_dir": str(run.run_dir),
        "dataset": run.splits.name,
        "class_names": run.splits.class_names,
        "num_queries": len(run.splits.test),
        "gallery_size": len(run.splits.test) - 1 if run.leave_one_out else len(run.splits.train),
        "protocol": "leave-one-out among the test items"
        if run.leave_one_out
        else "test queries vs train gallery",
        "world_size": dist.get_world_size(),
        "device": type(state.device).__name__,
        "checkpoint": saved[-1] if saved else None,
        "load_path": run.config.trainer.get("load_path"),
        "eval_history": run.gallery.history if run.gallery is not None else [],
    }


def _plot_retrievals(run: Any, test_embeddings: Any, path: Path, when: str) -> None:
    """For image data, a grid of test queries and their 5 nearest test items, marked right or wrong."""
    from composer_dynsample.reporting import plot_retrievals

    store = run.splits.test
    if len(store.feature_shape) != 3:  # (C, H, W) images only
        return
    title = f"{run.splits.name}: test queries and their nearest other test items ({when}); green = same class"
    plot_retrievals(
        store.features,
        store.labels,
        test_embeddings,
        path,
        distance=run.distance,
        title=title,
        class_names=run.splits.class_names,
    )


def _report(
    run: Any, metrics: dict[str, Any], final: dict[str, float], test_embeddings: Any, *, quiet: bool
) -> None:
    """Rank 0's outputs of a training run: metrics.json, embeddings.png, the table and one summary line."""
    from composer_dynsample.reporting import format_metrics_table, plot_embeddings, write_json

    write_json(run.run_dir / "metrics.json", metrics)
    title = f"{run.splits.name} test embeddings (PCA), epoch {metrics['epochs']}"
    if final.get("recall_at_1") is not None:
        against = "leave-one-out among the test items" if run.leave_one_out else "vs train gallery"
        title += f"\nRecall@1 {against} = {final['recall_at_1']:.4f}"
    plot_embeddings(
        test_embeddings,
        run.splits.test.labels,
        run.run_dir / "embeddings.png",
        title=title,
        class_names=run.splits.class_names,
    )
    _plot_retrievals(run, test_embeddings, run.run_dir / "retrievals.png", f"epoch {metrics['epochs']}")
    if not quiet:
        table_title = f"final retrieval metrics: {len(run.splits.test)} {run.splits.name} test queries " + (
            "leave-one-out among themselves (unseen classes)"
            if run.leave_one_out
            else f"vs {len(run.splits.train)} train items"
        )
        print("\n" + format_metrics_table(final, title=table_title))
    resumed = f" (resumed at epoch {metrics['resumed_from_epoch']})" if metrics["resumed_from_batch"] else ""
    print(
        f"trained {metrics['epochs_this_run']} epochs{resumed} to epoch {metrics['epochs']} in "
        f"{metrics['wall_time_s']:.1f} s; wrote {run.run_dir}"
    )


def _checkpoint_run(
    config: str | os.PathLike[str] | Mapping[str, Any],
    checkpoint: str | os.PathLike[str],
    overrides: Sequence[str],
    run_dir: str | os.PathLike[str] | None,
    trust_checkpoint: bool,
) -> Any:
    """A run with the checkpoint's model weights loaded and nothing saved: for eval and embed."""
    from composer_dynsample.checkpoints import check_checkpoint

    check_checkpoint(checkpoint, trusted=trust_checkpoint)
    settings = {
        "trainer.load_path": str(Path(checkpoint).expanduser()),
        "trainer.load_weights_only": True,
        "trainer.autoresume": False,  # the config's autoresume would load the run's latest checkpoint instead
        "trainer.save_folder": None,
        "evaluation.interval": None,
    }
    run, _ = _build(
        config, overrides, run_dir, quiet=True, trust_checkpoint=True, overwrite=None, settings=settings
    )
    return run


def evaluate(
    config: str | os.PathLike[str] | Mapping[str, Any],
    checkpoint: str | os.PathLike[str],
    overrides: Sequence[str] = (),
    *,
    out: str | os.PathLike[str] | None = None,
    trust_checkpoint: bool = False,
) -> dict[str, Any]:
    """Score a saved checkpoint: the test queries against the train gallery, as at the end of ``train``.

    Args:
        config (str | os.PathLike | Mapping): The config the checkpoint was trained with.
        checkpoint (str | os.PathLike): The checkpoint file.
        overrides (Sequence[str]): Dotted overrides (e.g. ``evaluation.ks=[1,10]``). Default: none.
        out (str | os.PathLike, optional): Where to write the metrics as JSON. Default: ``eval.json``
            beside the checkpoint's ``checkpoints`` folder (the run directory).
        trust_checkpoint (bool): Skip the safety check of the file. Default: ``False``.

    For image data the test queries and their nearest test items are also drawn beside the json: as
    ``retrievals.png``, or ``<json stem>-retrievals.png`` in the checkpoint's run directory, whose
    ``retrievals.png`` is the training run's (``eval-retrievals.png`` by default).

    Returns:
        dict[str, Any]: The metrics, the checkpoint and the timestamp it holds.

    Raises:
        OutputError: If ``out`` is a directory or under a file (before anything is loaded).
    """
    run_dir = _run_dir_of(Path(checkpoint))
    path = _out_path(out if out is not None else run_dir / "eval.json", "eval.json")
    plot = path.with_name(
        f"{path.stem}-retrievals.png" if _same_dir(path.parent, run_dir) else "retrievals.png"
    )
    run = _checkpoint_run(config, checkpoint, overrides, None, trust_checkpoint)
    from composer_dynsample.reporting import format_metrics_table, write_json

    final, test_embeddings = evaluate_run(run)
    result = {**final, "checkpoint": str(checkpoint), "dataset": run.splits.name}
    if _is_rank_zero():
        write_json(path, result)
        _plot_retrievals(run, test_embeddings, plot, Path(checkpoint).name)
        print(format_metrics_table(final, title=f"{run.splits.name}: {Path(checkpoint).name}"))
        print(f"wrote {path}")
    return result


def embed(
    config: str | os.PathLike[str] | Mapping[str, Any],
    checkpoint: str | os.PathLike[str],
    out: str | os.PathLike[str],
    overrides: Sequence[str] = (),
    *,
    split: str = "test",
    trust_checkpoint: bool = False,
) -> Path:
    """Write a split's embeddings, labels and dataset indices with a checkpoint's model to an ``.npz`` file.

    Args:
        config (str | os.PathLike | Mapping): The config the checkpoint was trained with.
        checkpoint (str | os.PathLike): The checkpoint file.
        out (str | os.PathLike): The ``.npz`` file (``.npz`` is appended when missing, as numpy does):
            arrays ``embeddings`` (N, D) float32, ``labels`` (N,) and ``indices`` (N,), the rows of the split.
        overrides (Sequence[str]): Dotted overrides. Default: none.
        split (str): ``"test"`` or ``"train"``. Default: ``"test"``.
        trust_checkpoint (bool): Skip the safety check of the file. Default: ``False``.

    Returns:
        Path: The file written.

    Raises:
        OutputError: If ``out`` is a directory or under a file (before anything is loaded).
    """
    import numpy as np

    from composer_dynsample.callbacks.retrieval_gallery import embed_store
    from composer_dynsample.validation import check_choice

    check_choice("split", split, ("test", "train"))
    path = _out_path(out, "embeddings.npz", ".npz")
    run = _checkpoint_run(config, checkpoint, overrides, None, trust_checkpoint)
    store = run.splits.test if split == "test" else run.splits.train
    embeddings = embed_store(run.trainer.state.model, store).cpu()
    if _is_rank_zero():
        path.parent.mkdir(parents=True, exist_ok=True)
        np.savez(
            path,
            embeddings=embeddings.numpy().astype(np.float32),
            labels=store.labels.numpy(),
            indices=np.arange(len(store), dtype=np.int64),
        )
        print(f"wrote {tuple(embeddings.shape)} {split} embeddings of {run.splits.name} to {path}")
    return path


def _run_dir_of(checkpoint: Path) -> Path:
    # os.path.realpath, unlike Path.resolve, does not raise on a symlink loop: check_checkpoint names it
    folder = Path(os.path.realpath(checkpoint.expanduser())).parent
    return folder.parent if folder.name == "checkpoints" else folder


def _same_dir(first: Path, second: Path) -> bool:
    return first.expanduser().resolve() == second.expanduser().resolve()
