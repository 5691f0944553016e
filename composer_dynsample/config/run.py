"""The training run: every builder's product put together into a Composer ``Trainer``."""

from __future__ import annotations

import contextlib
import os
import tempfile
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from composer import Trainer
from composer.core import Callback
from composer.utils import reproducibility
from omegaconf import DictConfig
from torch.utils.data import DataLoader

from composer_dynsample.callbacks.progress_lines import STATELESS_WARNING
from composer_dynsample.callbacks.retrieval_gallery import RetrievalGallery
from composer_dynsample.checkpoints import CheckpointError
from composer_dynsample.config.builders import (
    build_algorithms,
    build_callbacks,
    build_data,
    build_loggers,
    build_optimizer,
    build_scheduler,
    build_train_dataloader,
    composer_dataloader,
)
from composer_dynsample.config.checks import TRAINER_OWNED, check_trainer_basics
from composer_dynsample.config.components import ConfigError, check_keys, peek_entry
from composer_dynsample.config.device import (
    apply_device_settings,
    device_defaults,
    fill_device_defaults,
    run_device,
)
from composer_dynsample.config.evaluation import LEAVE_ONE_OUT, build_evaluation, protocol_of, source_splits
from composer_dynsample.config.loading import (
    default_run_dir,
    evaluation_config,
    expand_trainer_paths,
    load_config,
    run_options,
    section,
)
from composer_dynsample.config.mix_data import check_mix_pools, for_each_source
from composer_dynsample.config.model_builders import build_model
from composer_dynsample.config.names import SAMPLERS
from composer_dynsample.config.parameters import parameters
from composer_dynsample.config.sampler_table import check_sampler_table
from composer_dynsample.data import DatasetSplits
from composer_dynsample.data.identity import DataChangedError, data_changes, data_identity
from composer_dynsample.distributed import get_world_size
from composer_dynsample.models.embedding_model import EmbeddingModel
from composer_dynsample.samplers.pk import PKBatchSampler
from composer_dynsample.validation import is_int

__all__ = [
    "DataIdentity",
    "TrainingRun",
    "build_run",
    "check_pair_batches",
    "composer_reads_as_path",
    "default_run_dir",
    "trainer_defaults",
]


def trainer_defaults(run_dir: Path, *, folder: Path | None = None) -> dict[str, Any]:
    """The ``composer.Trainer`` arguments the run sets unless the ``trainer`` section does.

    ``save_folder`` and ``run_name`` are also what ``trainer.autoresume`` needs: Composer resumes from
    ``RUN_DIR/checkpoints/latest-rank0.pt`` when it exists. ``folder`` is the path Composer is given for
    ``run_dir`` (see :func:`composer_reads_as_path`). Default: ``run_dir`` itself.
    """
    return {
        "save_folder": str((folder or run_dir) / "checkpoints"),
        # Whether a run directory may be reused is decided before this (the CLI refuses a previous run
        # unless --overwrite, which first removes its outputs, a resume from a checkpoint inside it, or
        # trainer.autoresume); a run resumed in its own directory must then be free to replace
        # latest-rank0.pt.
        "save_overwrite": True,
        "run_name": run_dir.name or "run",
        "progress_bar": True,
        "log_to_console": False,
    }


def composer_reads_as_path(path: str) -> bool:
    """Whether Composer reads ``path``, given as a ``save_folder``, ``load_path`` or file name, as itself.

    Composer formats these strings (``{rank}``, ``{run_name}``) and parses them as URLs: ``#`` starts a
    fragment, ``?`` a query, ``a:b`` names a scheme, ``//a`` a host, tabs and newlines are dropped and
    leading spaces stripped. A path for which any of that changes something is not read as itself.

    Example:
        >>> composer_reads_as_path("runs/exp-1"), composer_reads_as_path("runs/exp#1")
        (True, False)
        >>> composer_reads_as_path("runs/{rank}"), composer_reads_as_path("exp:1/run")
        (False, False)
    """
    from urllib.parse import urlparse

    if any(char in "{}" or ord(char) < 32 or ord(char) == 127 for char in path):
        return False
    parsed = urlparse(path)
    return not parsed.scheme and not parsed.netloc and parsed.path == path and not path[:1].isspace()


def _composer_run_dir(cfg: DictConfig, directory: Path) -> tuple[Path, tempfile.TemporaryDirectory | None]:
    """The path Composer writes ``directory`` through, and the temporary folder that holds it, if any.

    A run directory that Composer would not read as itself (``exp#1``, ``{rank}``, a tab) is given to
    Composer as a symbolic link to it in a temporary folder: its checkpoints and logs still land inside
    the run directory, never in another (``exp#1`` and ``exp#2`` both writing to ``exp/``). Only when
    Composer writes there: the default ``save_folder``, or a ``file`` logger.
    """
    trainer, loggers = section(cfg, "trainer", "trainer"), section(cfg, "loggers", "loggers")
    writes = "save_folder" not in trainer or "file" in loggers
    if not writes or all(
        composer_reads_as_path(str(path)) for path in (directory, directory / "checkpoints")
    ):
        return directory, None
    directory.mkdir(parents=True, exist_ok=True)
    folder = tempfile.TemporaryDirectory(prefix="composer-dynsample-")
    link = Path(folder.name) / "run"
    link.symlink_to(directory.resolve(), target_is_directory=True)
    return link, folder


def _trainer_kwargs(cfg: DictConfig, run_dir: Path, composer_dir: Path) -> dict[str, Any]:
    values = section(cfg, "trainer", "trainer")
    check_trainer_basics(values)
    valid = [key for key in parameters(Trainer) if key not in TRAINER_OWNED]
    check_keys("trainer", values, valid, "composer.Trainer")
    expand_trainer_paths(values)
    return {**trainer_defaults(run_dir, folder=composer_dir), **values}


@contextlib.contextmanager
def _composer_load_path(trainer_kwargs: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The Trainer's arguments, with a local ``load_path`` that Composer reads as the file it names.

    Composer parses ``load_path`` as a URL (and formats ``{rank}`` in it), so ``#`` or ``?`` in a local
    path would cut it short (and load another file than the one checked): such a file is loaded through
    a symbolic link in a temporary folder, removed once the Trainer has loaded it.
    """
    path = trainer_kwargs.get("load_path")
    if not isinstance(path, str) or "://" in path or composer_reads_as_path(path):
        yield trainer_kwargs
        return
    with tempfile.TemporaryDirectory(prefix="composer-dynsample-") as folder:
        link = Path(folder) / "checkpoint.pt"
        link.symlink_to(Path(path).resolve())
        yield {**trainer_kwargs, "load_path": str(link)}


def _mismatch(error: RuntimeError, trainer_kwargs: dict[str, Any]) -> CheckpointError | None:
    """A checkpoint whose weights do not fit the config's model, as one line (``None`` for other errors)."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    if not lines or not lines[0].startswith("Error(s) in loading state_dict"):
        return None
    detail = lines[1] if len(lines) > 1 else lines[0]
    detail = detail if len(detail) <= 300 else detail[:297] + "..."
    more = f" (and {len(lines) - 2} more)" if len(lines) > 2 else ""
    return CheckpointError(
        f"{_checkpoint_source(trainer_kwargs)} does not match the config's model (was it trained with this "
        f"config and these overrides?): {detail}{more}"
    )


def _checkpoint_source(trainer_kwargs: dict[str, Any]) -> str:
    """The checkpoint the Trainer loaded, as a message names it."""
    if trainer_kwargs.get("autoresume"):
        return f"the latest checkpoint in {str(trainer_kwargs.get('save_folder'))!r} (trainer.autoresume)"
    return f"checkpoint {str(trainer_kwargs.get('load_path'))!r}"


class DataIdentity(Callback):
    """Record the run's data in every checkpoint, and refuse to resume from a checkpoint of other data.

    A resumed run whose data file was replaced would go on training on other rows, and what the
    checkpoint keeps per row (an embedding table, a sampler's snapshot) would point at the wrong ones.
    The state is :func:`~composer_dynsample.data.identity.data_identity`; loading a checkpoint whose recorded
    data differ raises :class:`~composer_dynsample.data.identity.DataChangedError` on every rank, unless
    ``allow_changed``. A checkpoint that recorded nothing (saved without this callback) is not checked.

    Args:
        identity (dict[str, Any]): The run's data identity.
        allow_changed (bool): Resume on other data anyway (``resume_on_changed_data: true``). Default: ``False``.
    """

    def __init__(self, identity: dict[str, Any], allow_changed: bool = False) -> None:
        self.identity = dict(identity)
        self.allow_changed = bool(allow_changed)

    def state_dict(self) -> dict[str, Any]:
        return dict(self.identity)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Compare the checkpoint's data with the run's.

        Raises:
            DataChangedError: If they differ and ``allow_changed`` is off.
        """
        changes = data_changes(state, self.identity)
        if changes and not self.allow_changed:
            raise DataChangedError(changes)


def check_pair_batches(cfg: DictConfig, splits: DatasetSplits) -> None:
    """For pairs data, refuse a sampler's batch that the training pairs cannot fill, in the words of pairs.

    A pair is a class of exactly two rows, a query and its passage: a P x K sampler (``pk``,
    ``hard_class_pk``) takes ``samples_per_class`` 2 and ``classes_per_batch`` pairs, ``mined_negatives``
    takes ``pairs_per_batch`` pairs, and neither may exceed the training pairs. Other data, and other
    samplers, are left to the sampler's own checks.

    Args:
        cfg (DictConfig): The config.
        splits (DatasetSplits): Its data.

    Raises:
        ConfigError: If ``samples_per_class`` is above 2 (unless ``small_classes: replace``) or a batch
            holds more pairs than the training split.
    """
    store, values = splits.train, section(cfg, "sampler", "sampler")
    is_query = getattr(store, "is_query", None)
    if not values or is_query is None or not bool(is_query[: len(store)].any()):
        return
    target = peek_entry("sampler", values, SAMPLERS)
    pairs = len(store) // 2
    k = values.get("samples_per_class")
    pk = isinstance(target, type) and issubclass(target, PKBatchSampler)
    if pk and is_int(k) and int(k) > 2 and values.get("small_classes") != "replace":
        raise ConfigError(
            f"sampler.samples_per_class={k}: pairs data have exactly 2 rows per class, a query and its "
            "passage, so samples_per_class must be 2 (and sampler.classes_per_batch counts the pairs of a "
            "batch); for more passages per query use sampler.name: mined_negatives, or given negatives "
            "(a 'negative' column)."
        )
    key = "classes_per_batch" if pk else "pairs_per_batch" if "is_passage" in parameters(target) else None
    size = values.get(key) if key is not None else None
    if is_int(size) and int(size) > pairs:
        fix = f"use sampler.{key} in [2, {pairs}] or " if pairs >= 2 else ""
        raise ConfigError(
            f"sampler.{key}={size}: a batch of {size} pairs needs {size} training pairs, but the training "
            f"split holds {pairs}{_test_share(splits)}; {fix}add training pairs."
        )


def _test_share(splits: DatasetSplits) -> str:
    """`` (the test split took N of the file's pairs)`` when the test pairs were cut from the training file."""
    info = getattr(splits, "info", None)
    if getattr(info, "split", None) not in ("random", "group"):
        return ""
    return f" (the test split took {len(splits.test) // 2} of the file's pairs)"


@dataclass
class TrainingRun:
    """Everything :func:`build_run` made; ``trainer.fit()`` trains it.

    Attributes:
        config (DictConfig): The resolved config (with ``run_dir`` filled in).
        run_dir (Path): Where the run writes its files.
        trainer (composer.Trainer): The trainer, ready to ``fit``.
        model (EmbeddingModel): The model.
        splits (DatasetSplits): The data: ``train`` is the gallery, ``test`` the queries.
        train_dataloader (DataLoader): The P x K train loader.
        ks (tuple[int, ...]): The ``K`` of Recall@K.
        distance (str): The evaluation distance.
        batch_sizes (tuple[int, int]): Queries and gallery items per forward pass of the evaluation after
            training (``evaluation.batch_size`` and ``evaluation.gallery_batch_size``).
        gallery (RetrievalGallery | None): The callback that attaches the gallery at ``EVAL_START``: the
            train split, or a pair split's test passages (``None`` when the test split is scored
            leave-one-out, or without evaluation).
        seed (int): The run's seed.
        composer_run_dir (Path | None): The path Composer writes ``run_dir`` through when it would not read
            ``run_dir`` itself as a local path (a symbolic link to it, see
            :func:`composer_reads_as_path`); ``None`` when it is ``run_dir``.
        device_defaults (dict[str, Any]): What the run took from its device because the config did not
            say (see :mod:`~composer_dynsample.config.device`): the keys written into :attr:`config`
            (``trainer.precision``, ``dataloader`` keys, ``pad_to_multiple_of``), and ``tf32``: whether TF32
            was turned on.
    """

    config: DictConfig
    run_dir: Path
    trainer: Trainer
    model: EmbeddingModel
    splits: DatasetSplits
    train_dataloader: DataLoader
    ks: tuple[int, ...]
    distance: str
    batch_sizes: tuple[int, int] = (1000, 2048)
    gallery: RetrievalGallery | None = None
    seed: int = 0
    leave_one_out: bool = False
    composer_run_dir: Path | None = None
    link_folder: Any = field(default=None, repr=False)  # keeps the link's temporary folder alive
    device_defaults: dict[str, Any] = field(default_factory=dict)

    def local_path(self, path: str | os.PathLike[str]) -> Path:
        """A path Composer reported (a saved checkpoint) as a path inside :attr:`run_dir`."""
        if self.composer_run_dir is not None:
            with contextlib.suppress(ValueError):
                return self.run_dir / Path(path).relative_to(self.composer_run_dir)
        return Path(path)


def build_run(
    cfg: DictConfig, run_dir: str | os.PathLike[str] | None = None, *, callbacks: Sequence[Callback] = ()
) -> TrainingRun:
    """Build the data, loaders, model, optimizer, scheduler, algorithms, callbacks and the ``Trainer``.

    The train loader is built before the model and the evaluation, so that a batch the data cannot fill
    is said before anything that follows from the data's size. The run's callbacks end with a
    :class:`DataIdentity`, which records the data in every checkpoint.

    First, the device's settings fill what the config leaves out (see
    :mod:`~composer_dynsample.config.device`): on a CUDA device ``trainer.precision: amp_bf16`` (where the
    GPU has bf16), a loader of 2 pinned, persistent workers and text batches padded to a multiple of 8; on
    the CPU ``fp32``, no workers and no padding, as before. They are written into the returned config
    (and so into ``config.yaml``); TF32 is turned on for the process on such a GPU, unless
    ``trainer.precision`` is ``fp32``, before the model is built.

    Args:
        cfg (DictConfig): A config from :func:`~composer_dynsample.config.load_config`.
        run_dir (str | os.PathLike, optional): Output directory; overrides the config's ``run_dir``.
            Default: the config's ``run_dir``, else ``runs/default``.
        callbacks (Sequence[Callback]): Callbacks added after the config's. Default: none.

    Returns:
        TrainingRun: The trainer and what it was built from. Nothing is written to disk yet, except what
        Composer's ``Trainer`` creates (the checkpoint folder on rank 0; a ``load_path`` is loaded).

    Raises:
        ConfigError: If a key or value is wrong, or a model-aware sampler has no embedding table.
        CheckpointError: If the checkpoint loaded (``trainer.load_path``, or the latest one with
            ``trainer.autoresume``) does not fit the model the config builds, or was trained on other
            data (unless ``resume_on_changed_data: true``).
    """
    cfg = load_config(cfg)
    options = run_options(cfg)
    directory = Path(
        run_dir if run_dir is not None else options.run_dir or default_run_dir(None)
    ).expanduser()
    cfg.run_dir = str(directory)
    device_settings = _device_settings(cfg)
    evaluation = evaluation_config(cfg)
    check_sampler_table(section(cfg, "sampler", "sampler"), section(cfg, "algorithms", "algorithms"))
    reproducibility.seed_all(options.seed)
    check_mix_pools(cfg, get_world_size())  # no pool of embeddings across two sources
    splits = build_data(cfg)
    for_each_source(cfg, splits, check_pair_batches)
    # The samplers draw from generators of their own: the model's initialisation does not depend on this order.
    train_loader = build_train_dataloader(cfg, splits.train, options.seed)
    model = build_model(cfg, splits)
    arguments: dict[str, Any] = {
        "model": model,
        "train_dataloader": composer_dataloader(train_loader),  # a DataSpec for texts
        "optimizers": build_optimizer(cfg, model),
        "schedulers": build_scheduler(cfg),
        # An embedding table's encodes (warm start, refresh) batch as the evaluation's gallery unless told.
        "algorithms": build_algorithms(cfg, supplied={"refresh_batch_size": evaluation.gallery_batch_size}),
        "seed": options.seed,
    }
    allow_changed = options.resume_on_changed_data
    identity = DataIdentity(data_identity(splits), allow_changed=allow_changed)
    all_callbacks = [*build_callbacks(cfg), *callbacks, identity]
    composer_dir, link_folder = _composer_run_dir(cfg, directory)
    arguments["loggers"] = build_loggers(cfg, composer_dir)
    trainer_kwargs = _trainer_kwargs(cfg, directory, composer_dir)

    # Data whose test classes are not in the train split (glyphs) scores each test item against the
    # other test items; the eval metrics do that when no gallery is attached. See config/evaluation.py.
    leave_one_out = protocol_of(splits) == LEAVE_ONE_OUT
    galleries, eval_arguments = _evaluation(evaluation, splits)
    all_callbacks += galleries
    gallery = galleries[0] if len(galleries) == 1 else None  # its history: the evaluations of one test split
    arguments.update(eval_arguments)
    shown = trainer_defaults(directory) if link_folder is not None else {}
    named = {**trainer_kwargs, **shown, **section(cfg, "trainer", "trainer")}  # the paths the user gave
    trainer = _trainer(cfg, {**arguments, "callbacks": all_callbacks}, trainer_kwargs, named)
    run = TrainingRun(
        cfg, directory, trainer, model, splits, train_loader, tuple(evaluation.ks), evaluation.distance
    )
    run.gallery, run.seed, run.leave_one_out = gallery, options.seed, leave_one_out
    run.device_defaults = device_settings
    run.batch_sizes = (evaluation.batch_size, evaluation.gallery_batch_size)
    if link_folder is not None:
        run.composer_run_dir, run.link_folder = composer_dir, link_folder
    return run


def _device_settings(cfg: DictConfig) -> dict[str, Any]:
    """Fill the config's device-dependent defaults and set TF32; what was filled, and ``tf32``."""
    defaults = device_defaults(*run_device(section(cfg, "trainer", "trainer")))
    filled = fill_device_defaults(cfg, defaults)
    tf32 = apply_device_settings(defaults, cfg.trainer.get("precision"))
    return {**filled, "tf32": tf32}


def _evaluation(evaluation: Any, splits: DatasetSplits) -> tuple[list[RetrievalGallery], dict[str, Any]]:
    """The gallery callbacks and the Trainer's eval arguments; none without ``evaluation.interval``.

    One evaluator, ``test``; a mix of data sets one per source, ``test_NAME``, each with its gallery.
    """
    if evaluation.interval is None:
        return [], {}
    plans = [build_evaluation(evaluation, one, label) for label, one in source_splits(splits).items()]
    evaluators = [plan.evaluator for plan in plans]
    return [plan.gallery for plan in plans if plan.gallery is not None], {
        "eval_dataloader": evaluators if len(evaluators) > 1 else evaluators[0],
        "eval_interval": evaluation.interval,
    }


def _trainer(
    cfg: DictConfig, arguments: dict[str, Any], trainer_kwargs: dict[str, Any], named: dict[str, Any]
) -> Trainer:
    """The ``Trainer`` of the built objects and the ``trainer`` section; its errors as one line.

    ``named`` holds the ``trainer`` paths as the user gave them, for naming the checkpoint loaded.
    """
    try:
        with _composer_load_path(trainer_kwargs) as composer_kwargs, warnings.catch_warnings():
            # A checkpoint of a run without progress lines resumes exactly with them: they keep no state.
            warnings.filterwarnings("ignore", message=STATELESS_WARNING, category=UserWarning)
            return Trainer(**arguments, **composer_kwargs)
    except DataChangedError as error:  # raised by DataIdentity while the checkpoint is loaded
        raise CheckpointError(
            f"{_checkpoint_source(named)} was trained on other data: {error}. Resuming would train on other "
            "rows than those it was trained on (an embedding table or sampler state in it would point at the "
            "wrong rows); resume with its data, or set resume_on_changed_data=true to continue on this data."
        ) from None
    except (TypeError, ValueError) as error:
        raise ConfigError(
            f"trainer: composer.Trainer rejected the config {section(cfg, 'trainer', 'trainer')}: {error}"
        ) from error
    except RuntimeError as error:  # load_state_dict: the checkpoint's weights do not fit the model
        mismatch = _mismatch(error, named)
        if mismatch is None:
            raise
        raise mismatch from error
