"""Build a Composer ``Trainer`` for metric learning from a YAML config (torchtune style).

A config is a YAML mapping of sections. A section that picks a class names it with ``name:`` from a
small registry, and its other keys are that class's keyword arguments, one to one; sections whose
entries are a set (``algorithms``, ``callbacks``, ``loggers``) map registry names to keyword
arguments (``{}`` for the defaults; ``null`` or absent turns the entry off). Every key is checked
against ``inspect.signature`` of its target, so a typo fails early with the key and the valid ones::

    seed: 0
    run_dir: runs/mnist1d_default          # optional; --run-dir overrides it
    data: {name: mnist1d}                  # DATASETS: load_mnist1d(**kwargs), load_digits, load_file
    model:                                 # EmbeddingModel(encoder, loss, **kwargs)
      normalize: true
      encoder: {name: conv1d, channels: 64, embedding_dim: 64}   # ENCODERS
      loss: {name: triplet_margin, margin: 0.2}                  # LOSSES
    sampler: {name: pk, classes_per_batch: 16, samples_per_class: 8}   # SAMPLERS
    dataloader: {num_workers: 0}           # DataLoader arguments of the train loader
    algorithms: {hard_negative_mining: {strategy: semi_hard}}   # ALGORITHMS
    callbacks: {set_sampler_epoch: {}}     # CALLBACKS
    optimizer: {name: adamw, lr: 0.003}    # OPTIMIZERS (the lr is the peak lr of a schedule)
    scheduler: {name: one_cycle, pct_start: 0.25}   # SCHEDULERS, or null
    evaluation: {interval: 10ep, ks: [1, 5]}        # see EVALUATION_KEYS
    trainer: {max_duration: 60ep}          # any composer.Trainer argument the builder does not own
    loggers: {}                            # LOGGERS

Arguments that come from elsewhere are filled in by the builder and are not valid keys: the labels
of a sampler, ``num_replicas`` and ``rank`` (from the launcher), the optimizer's ``params``. Arguments
that can be read off the data are inferred unless given: ``input_length`` and ``in_channels`` of
``conv1d``, ``in_features`` of ``mlp``, and a sampler's ``seed`` (the top-level ``seed``).

:func:`load_config` reads a file and dotted overrides (``trainer.max_duration=2ep``) with OmegaConf;
:func:`build_run` turns a config into a ready :class:`TrainingRun`; ``composer-dynsample train`` (see
:mod:`composer_dynsample.cli`) runs it. Problems raise :class:`ConfigError`, a ``ValueError`` whose
message names the key, the value and what is valid.
"""

from __future__ import annotations

import inspect
import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import yaml
from composer import Trainer
from composer.core import Evaluator, State, Time, TimeUnit
from composer.utils import dist, reproducibility
from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException
from torch.utils.data import DataLoader

from composer_dynsample.algorithms import HardNegativeMining
from composer_dynsample.callbacks.retrieval_gallery import RetrievalGallery
from composer_dynsample.callbacks.set_sampler_epoch import SetSamplerEpoch
from composer_dynsample.data import (
    DatasetSplits,
    GatherCollate,
    IndexDataset,
    TensorStore,
    load_digits,
    load_file,
    load_mnist1d,
    stratified_split,
)
from composer_dynsample.losses import ContrastiveLoss, MultiSimilarityLoss, TripletMarginLoss
from composer_dynsample.metrics import MeanAveragePrecisionAtR, RetrievalRecallAtK, RPrecision
from composer_dynsample.models.embedding_model import EmbeddingModel
from composer_dynsample.models.encoders import Conv1dEncoder, MLPEncoder
from composer_dynsample.samplers import PKBatchSampler, TwoStreamBatchSampler
from composer_dynsample.samplers.dataloader import build_dataloader

__all__ = [
    "ALGORITHMS",
    "CALLBACKS",
    "DATASETS",
    "ENCODERS",
    "EVALUATION_KEYS",
    "LOGGERS",
    "LOSSES",
    "OPTIMIZERS",
    "SAMPLERS",
    "SCHEDULERS",
    "SECTIONS",
    "ConfigError",
    "OneCycleScheduler",
    "Registered",
    "TrainingRun",
    "build_run",
    "load_config",
    "save_config",
]


class ConfigError(ValueError):
    """A config key or value is wrong; the message names the key, the value and what is valid."""


@dataclass(frozen=True)
class Registered:
    """A registry entry: the class or function a ``name:`` picks, and which of its arguments are not keys.

    Attributes:
        target (Callable[..., Any]): The class or function.
        reserved (tuple[str, ...]): Arguments the builder always supplies; a config key for them is an error.
        inferred (tuple[str, ...]): Arguments the builder supplies unless the config gives them.
        extra (Mapping[str, Any]): Builder-level keys that are not arguments of ``target``, with defaults.
    """

    target: Callable[..., Any]
    reserved: tuple[str, ...] = ()
    inferred: tuple[str, ...] = ()
    extra: Mapping[str, Any] = field(default_factory=dict)

    def valid_keys(self) -> list[str]:
        """The keys a config section may hold for this entry (besides ``name``)."""
        keys = [
            name
            for name, parameter in _parameters(self.target).items()
            if parameter.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
            and name not in self.reserved
        ]
        return sorted({*keys, *self.extra})

    def required_keys(self) -> list[str]:
        """Arguments without a default that neither the builder nor ``extra`` supplies."""
        return [
            name
            for name, parameter in _parameters(self.target).items()
            if parameter.default is inspect.Parameter.empty
            and parameter.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
            and name not in self.reserved
            and name not in self.inferred
        ]


def _parameters(target: Callable[..., Any]) -> Mapping[str, inspect.Parameter]:
    parameters = dict(inspect.signature(target).parameters)
    parameters.pop("self", None)
    return parameters


class OneCycleScheduler:
    """A Composer scheduler with the learning-rate shape of ``torch.optim.lr_scheduler.OneCycleLR``.

    The multiplier of the optimizer's ``lr`` (the peak) rises from ``1 / div_factor`` to 1 over the first
    ``pct_start`` of training, then falls to ``1 / (div_factor * final_div_factor)``, both with cosine
    (or linear) annealing. Progress is measured per batch as a fraction of the trainer's
    ``max_duration``, so unlike ``OneCycleLR`` it needs no step count and a resumed run may train for
    longer than the run it resumes (the schedule stretches to the new ``max_duration``).

    Args:
        pct_start (float): Fraction of training spent rising, in ``(0, 1)``. Default: ``0.3``.
        div_factor (float): Initial lr = peak / ``div_factor``, >= 1. Default: ``25.0``.
        final_div_factor (float): Final lr = initial lr / ``final_div_factor``, >= 1. Default: ``1e4``.
        anneal_strategy (str): ``"cos"`` or ``"linear"``. Default: ``"cos"``.

    Raises:
        ValueError: If an argument is out of range.

    Example:
        >>> scheduler = OneCycleScheduler(pct_start=0.25, div_factor=10.0, final_div_factor=100.0)
        >>> [round(scheduler.multiplier(p), 4) for p in (0.0, 0.25, 1.0)]
        [0.1, 1.0, 0.001]
    """

    def __init__(
        self,
        pct_start: float = 0.3,
        div_factor: float = 25.0,
        final_div_factor: float = 1e4,
        anneal_strategy: str = "cos",
    ) -> None:
        if isinstance(pct_start, bool) or not isinstance(pct_start, (int, float)) or not 0 < pct_start < 1:
            raise ValueError(f"pct_start must be a number in (0, 1), got {pct_start!r}.")
        for name, value in (("div_factor", div_factor), ("final_div_factor", final_div_factor)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 1:
                raise ValueError(f"{name} must be a number >= 1, got {value!r}.")
        if anneal_strategy not in ("cos", "linear"):
            raise ValueError(f"anneal_strategy must be 'cos' or 'linear', got {anneal_strategy!r}.")
        self.pct_start = float(pct_start)
        self.initial = 1.0 / float(div_factor)
        self.final = self.initial / float(final_div_factor)
        self.anneal_strategy = anneal_strategy

    def _anneal(self, start: float, end: float, fraction: float) -> float:
        if self.anneal_strategy == "cos":
            return end + (start - end) * 0.5 * (1.0 + math.cos(math.pi * fraction))
        return start + (end - start) * fraction

    def multiplier(self, progress: float) -> float:
        """The lr multiplier at ``progress`` (fraction of training done, clipped to ``[0, 1]``)."""
        progress = min(max(progress, 0.0), 1.0)
        if progress < self.pct_start:
            return self._anneal(self.initial, 1.0, progress / self.pct_start)
        return self._anneal(1.0, self.final, (progress - self.pct_start) / (1.0 - self.pct_start))

    def __call__(self, state: State, ssr: float = 1.0) -> float:
        """The multiplier at the state's current time (Composer's ``ComposerScheduler`` protocol)."""
        return self.multiplier(_progress(state))


def _progress(state: State) -> float:
    """Fraction of ``max_duration`` done, at batch resolution even when the duration is in epochs."""
    max_duration = state.max_duration
    if max_duration is None or int(max_duration.value) <= 0:
        return 0.0
    unit, total = max_duration.unit, float(max_duration.value)
    timestamp = state.timestamp
    if unit == TimeUnit.EPOCH:
        per_epoch = int(state.dataloader_len) if state.dataloader_len is not None else 0
        within = int(timestamp.batch_in_epoch) / per_epoch if per_epoch > 0 else 0.0
        return (int(timestamp.epoch) + min(within, 1.0)) / total
    return float(timestamp.get(unit).value) / total


def _composer_scheduler(name: str) -> Callable[..., Any]:
    from composer import optim

    return getattr(optim, name)


def _logger(name: str) -> Callable[..., Any]:
    from composer import loggers

    return getattr(loggers, name)


def _callback(name: str) -> Callable[..., Any]:
    from composer import callbacks

    return getattr(callbacks, name)


class _Lazy:
    """A registry target imported on first use (optional dependencies such as wandb stay optional)."""

    def __init__(self, resolve: Callable[[str], Callable[..., Any]], name: str) -> None:
        self._resolve, self._name = resolve, name
        self._target: Callable[..., Any] | None = None

    def get(self) -> Callable[..., Any]:
        if self._target is None:
            self._target = self._resolve(self._name)
        return self._target


DATASETS: dict[str, Registered] = {
    "mnist1d": Registered(load_mnist1d),
    "digits": Registered(load_digits),
    "file": Registered(load_file),
}
ENCODERS: dict[str, Registered] = {
    "conv1d": Registered(Conv1dEncoder, inferred=("input_length", "in_channels")),
    "mlp": Registered(MLPEncoder, inferred=("in_features",)),
}
LOSSES: dict[str, Registered] = {
    "triplet_margin": Registered(TripletMarginLoss),
    "contrastive": Registered(ContrastiveLoss),
    "multi_similarity": Registered(MultiSimilarityLoss),
}
SAMPLERS: dict[str, Registered] = {
    "pk": Registered(PKBatchSampler, reserved=("labels", "num_replicas", "rank"), inferred=("seed",)),
    "two_stream": Registered(
        TwoStreamBatchSampler,
        reserved=("primary_indices", "secondary_indices", "num_replicas", "rank"),
        inferred=("seed",),
        # The primary stream is a stratified `primary_fraction` of the train split, the secondary the rest.
        extra={"primary_fraction": 0.5},
    ),
}
ALGORITHMS: dict[str, Registered] = {"hard_negative_mining": Registered(HardNegativeMining)}
CALLBACKS: dict[str, Registered | _Lazy] = {
    "set_sampler_epoch": Registered(SetSamplerEpoch),
    "lr_monitor": _Lazy(_callback, "LRMonitor"),
    "speed_monitor": _Lazy(_callback, "SpeedMonitor"),
    "optimizer_monitor": _Lazy(_callback, "OptimizerMonitor"),
}
OPTIMIZERS: dict[str, Registered] = {
    "adamw": Registered(torch.optim.AdamW, reserved=("params",)),
    "adam": Registered(torch.optim.Adam, reserved=("params",)),
    "sgd": Registered(torch.optim.SGD, reserved=("params",)),
}
SCHEDULERS: dict[str, Registered | _Lazy] = {
    "one_cycle": Registered(OneCycleScheduler),
    "cosine_with_warmup": _Lazy(_composer_scheduler, "CosineAnnealingWithWarmupScheduler"),
    "linear_with_warmup": _Lazy(_composer_scheduler, "LinearWithWarmupScheduler"),
    "constant_with_warmup": _Lazy(_composer_scheduler, "ConstantWithWarmupScheduler"),
}
LOGGERS: dict[str, Registered | _Lazy] = {
    "file": _Lazy(_logger, "FileLogger"),
    "in_memory": _Lazy(_logger, "InMemoryLogger"),
    "tensorboard": _Lazy(_logger, "TensorboardLogger"),
    "wandb": _Lazy(_logger, "WandBLogger"),
    "mlflow": _Lazy(_logger, "MLFlowLogger"),
}
#: The keys of the ``evaluation`` section and their defaults.
EVALUATION_KEYS: dict[str, Any] = {
    "interval": "1ep",  # Composer time string, or null: evaluate only once, after training
    "ks": [1, 5],  # the K of Recall@K
    "distance": "cosine",  # "cosine" or "euclidean"
    "batch_size": 1000,  # queries per evaluation batch
    "gallery_batch_size": 2048,  # gallery items embedded per forward pass
}
#: The top-level sections.
SECTIONS: tuple[str, ...] = (
    "seed",
    "run_dir",
    "data",
    "model",
    "sampler",
    "dataloader",
    "algorithms",
    "callbacks",
    "optimizer",
    "scheduler",
    "evaluation",
    "trainer",
    "loggers",
)
_REQUIRED_SECTIONS = ("data", "model", "sampler", "optimizer", "trainer")
_MODEL_OWNED = ("encoder", "loss", "train_metrics", "eval_metrics")
_DATALOADER_OWNED = (
    "dataset",
    "batch_size",
    "shuffle",
    "sampler",
    "batch_sampler",
    "drop_last",
    "collate_fn",
)
# Trainer arguments the builder constructs from other sections.
_TRAINER_OWNED = {
    "model": "model",
    "train_dataloader": "data/sampler/dataloader",
    "eval_dataloader": "evaluation",
    "eval_interval": "evaluation.interval",
    "optimizers": "optimizer",
    "schedulers": "scheduler",
    "algorithms": "algorithms",
    "callbacks": "callbacks",
    "loggers": "loggers",
    "seed": "seed (top level)",
}


# ---------------------------------------------------------------------------------------------------------
# Loading
# ---------------------------------------------------------------------------------------------------------


def load_config(
    config: str | os.PathLike[str] | Mapping[str, Any] | DictConfig, overrides: Sequence[str] = ()
) -> DictConfig:
    """Load a YAML config (or take a mapping) and apply dotted ``key.path=value`` overrides.

    Args:
        config (str | os.PathLike | Mapping | DictConfig): A YAML file, or the config itself.
        overrides (Sequence[str]): Items such as ``trainer.max_duration=2ep`` or ``evaluation.ks=[1,10]``,
            parsed by ``OmegaConf.from_dotlist`` and merged over the file. Default: none.

    Returns:
        DictConfig: The merged config, with interpolations resolved and its top-level sections checked.

    Raises:
        FileNotFoundError: If the file does not exist.
        ConfigError: If the YAML or an override is malformed, or a top-level key is unknown.

    Example:
        >>> minimal = {
        ...     "data": {"name": "digits"},
        ...     "model": {"encoder": {"name": "mlp"}},
        ...     "sampler": {"name": "pk", "classes_per_batch": 4, "samples_per_class": 4},
        ...     "optimizer": {"name": "adam"},
        ...     "trainer": {"max_duration": "2ep"},
        ... }
        >>> cfg = load_config(minimal, ["trainer.max_duration=3ep", "seed=1"])
        >>> cfg.trainer.max_duration, cfg.seed
        ('3ep', 1)
    """
    if isinstance(config, DictConfig):
        base = config.copy()
    elif isinstance(config, Mapping):
        base = OmegaConf.create(dict(config))
    else:
        path = Path(config).expanduser()
        if not path.is_file():
            raise FileNotFoundError(f"config file {str(path)!r} does not exist.")
        try:
            base = OmegaConf.load(path)
        except (OmegaConfBaseException, yaml.YAMLError) as error:
            raise ConfigError(f"{path}: not a valid YAML config: {error}") from error
        if not isinstance(base, DictConfig):
            raise ConfigError(f"{path}: a config must be a YAML mapping of sections, got a list.")
    bad = [item for item in overrides if not isinstance(item, str) or "=" not in item or item.startswith("=")]
    if bad:
        raise ConfigError(
            f"override {bad[0]!r} is not of the form key.path=value (e.g. trainer.max_duration=2ep)."
        )
    try:
        merged = OmegaConf.merge(base, OmegaConf.from_dotlist(list(overrides)))
        container = OmegaConf.to_container(merged, resolve=True)
    except OmegaConfBaseException as error:
        raise ConfigError(f"cannot apply the overrides {list(overrides)}: {error}") from error
    cfg = OmegaConf.create(container)
    unknown = [key for key in cfg if key not in SECTIONS]
    if unknown:
        raise ConfigError(f"unknown key {unknown[0]!r} at the top level; valid keys: {list(SECTIONS)}.")
    missing = [key for key in _REQUIRED_SECTIONS if cfg.get(key) is None]
    if missing:
        raise ConfigError(
            f"the config has no {missing[0]!r} section; required sections: {list(_REQUIRED_SECTIONS)}."
        )
    return cfg


def save_config(cfg: DictConfig, path: str | os.PathLike[str]) -> None:
    """Write the resolved config as YAML (what ``composer-dynsample train`` saves as ``config.yaml``)."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    OmegaConf.save(cfg, Path(path), resolve=True)


# ---------------------------------------------------------------------------------------------------------
# Section helpers
# ---------------------------------------------------------------------------------------------------------


def _plain(value: Any) -> Any:
    """An OmegaConf node as plain Python containers."""
    if isinstance(value, (DictConfig, ListConfig)):
        return OmegaConf.to_container(value, resolve=True)
    return value


def _section(cfg: DictConfig | Mapping[str, Any], key: str, path: str) -> dict[str, Any]:
    """``cfg[key]`` as a dict (``{}`` when absent or null), or a ConfigError if it is not a mapping."""
    value = _plain(cfg.get(key)) if key in cfg else None
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ConfigError(f"{path} must be a mapping of keys to values, got {value!r}.")
    return dict(value)


def _check_keys(path: str, section: Mapping[str, Any], valid: Sequence[str], what: str) -> None:
    unknown = [key for key in section if key not in valid]
    if unknown:
        raise ConfigError(f"{path}: unknown key {unknown[0]!r} for {what}; valid keys: {sorted(valid)}.")


def _lookup(path: str, name: Any, registry: Mapping[str, Registered | _Lazy]) -> Registered:
    if not isinstance(name, str) or name not in registry:
        raise ConfigError(f"{path}: unknown name {name!r}; valid names: {sorted(registry)}.")
    entry = registry[name]
    if isinstance(entry, _Lazy):
        try:
            return Registered(entry.get())
        except (ImportError, AttributeError) as error:
            raise ConfigError(f"{path}: {name!r} is not available here: {error}") from error
    return entry


def _call(path: str, entry: Registered, kwargs: Mapping[str, Any], *args: Any) -> Any:
    """Construct ``entry.target(*args, **kwargs)``, turning its errors into a ConfigError naming the section."""
    try:
        return entry.target(*args, **kwargs)
    except (TypeError, ValueError) as error:
        shown = ", ".join(f"{key}={value!r}" for key, value in kwargs.items() if key not in entry.reserved)
        raise ConfigError(
            f"{path}: {getattr(entry.target, '__name__', entry.target)}({shown}) rejected the config: {error}"
        ) from error


def _kwargs(path: str, section: Mapping[str, Any], entry: Registered, what: str) -> dict[str, Any]:
    """Check a section's keys against ``entry`` and return them as keyword arguments (``extra`` removed)."""
    _check_keys(path, section, entry.valid_keys(), what)
    return {key: value for key, value in section.items() if key not in entry.extra}


def _named(path: str, cfg: DictConfig | Mapping[str, Any], key: str, registry: Mapping[str, Any]):
    """Split a ``{name: ..., **kwargs}`` section into its registry entry, name and kwargs."""
    section = _section(cfg, key, path)
    if "name" not in section:
        raise ConfigError(f"{path} needs a 'name'; valid names: {sorted(registry)}.")
    name = section.pop("name")
    entry = _lookup(f"{path}.name", name, registry)
    missing = [arg for arg in entry.required_keys() if arg not in section]
    if missing:
        raise ConfigError(f"{path}: {name!r} needs the key {missing[0]!r}; valid keys: {entry.valid_keys()}.")
    return entry, name, _kwargs(path, section, entry, repr(name)), section


def _time(path: str, value: Any, units: Sequence[TimeUnit] | None = None) -> Time:
    try:
        time = Time.from_timestring(value) if isinstance(value, str) else None
    except ValueError:
        time = None
    if time is None and isinstance(value, int) and not isinstance(value, bool):
        time = Time(value, TimeUnit.EPOCH)
    if time is None or (units is not None and time.unit not in units):
        shown = "', '".join(f"1{unit.value}" for unit in (units or (TimeUnit.EPOCH, TimeUnit.BATCH)))
        raise ConfigError(f"{path} must be a Composer time string such as '{shown}', got {value!r}.")
    return time


# ---------------------------------------------------------------------------------------------------------
# Builders
# ---------------------------------------------------------------------------------------------------------


def build_data(cfg: DictConfig) -> DatasetSplits:
    """Load the dataset named by ``data.name`` with the section's other keys."""
    entry, _, kwargs, _ = _named("data", cfg, "data", DATASETS)
    try:
        return _call("data", entry, kwargs)
    except FileNotFoundError as error:
        raise ConfigError(f"data: {error}") from error


def build_encoder(cfg: DictConfig, feature_shape: tuple[int, ...]) -> torch.nn.Module:
    """Build ``model.encoder``, inferring input sizes from the data's ``feature_shape``."""
    path = "model.encoder"
    entry, name, kwargs, _ = _named(path, _section(cfg, "model", "model"), "encoder", ENCODERS)
    if name == "conv1d":
        if len(feature_shape) not in (1, 2):
            raise ConfigError(
                f"{path}: 'conv1d' needs sequences (N, L) or (N, C, L), but the data's items have shape "
                f"{feature_shape}; use 'mlp' for other data."
            )
        kwargs.setdefault("input_length", feature_shape[-1])
        kwargs.setdefault("in_channels", feature_shape[0] if len(feature_shape) == 2 else 1)
    elif name == "mlp":
        kwargs.setdefault("in_features", int(math.prod(feature_shape)))
    return _call(path, entry, kwargs)


def build_loss(cfg: DictConfig) -> torch.nn.Module:
    """Build ``model.loss`` (default: ``TripletMarginLoss(margin=0.2)``)."""
    model = _section(cfg, "model", "model")
    if model.get("loss") is None:
        return TripletMarginLoss(margin=0.2)
    entry, _, kwargs, _ = _named("model.loss", model, "loss", LOSSES)
    return _call("model.loss", entry, kwargs)


def eval_metric_names(cfg: DictConfig) -> tuple[tuple[int, ...], str]:
    """The validated ``evaluation.ks`` and ``evaluation.distance``."""
    evaluation = _evaluation(cfg)
    return tuple(evaluation["ks"]), evaluation["distance"]


def _evaluation(cfg: DictConfig) -> dict[str, Any]:
    section = _section(cfg, "evaluation", "evaluation")
    _check_keys("evaluation", section, list(EVALUATION_KEYS), "evaluation")
    values = {**EVALUATION_KEYS, **section}
    ks = values["ks"]
    ks = [ks] if isinstance(ks, int) else ks
    if (
        not isinstance(ks, list)
        or not ks
        or any(isinstance(k, bool) or not isinstance(k, int) or k < 1 for k in ks)
        or len(set(ks)) != len(ks)
    ):
        raise ConfigError(f"evaluation.ks must be a list of distinct integers >= 1, got {values['ks']!r}.")
    values["ks"] = ks
    if values["distance"] not in ("cosine", "euclidean"):
        raise ConfigError(f"evaluation.distance must be 'cosine' or 'euclidean', got {values['distance']!r}.")
    for key in ("batch_size", "gallery_batch_size"):
        value = values[key]
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"evaluation.{key} must be an integer >= 1, got {value!r}.")
    if values["interval"] is not None:
        _time("evaluation.interval", values["interval"], (TimeUnit.EPOCH, TimeUnit.BATCH))
    return values


def build_model(cfg: DictConfig, splits: DatasetSplits) -> EmbeddingModel:
    """Build the :class:`~composer_dynsample.EmbeddingModel` with its retrieval eval metrics."""
    model = _section(cfg, "model", "model")
    valid = [key for key in _parameters(EmbeddingModel) if key not in _MODEL_OWNED] + ["encoder", "loss"]
    _check_keys("model", model, valid, "EmbeddingModel")
    if model.get("encoder") is None:
        raise ConfigError(f"model needs an 'encoder' section; valid names: {sorted(ENCODERS)}.")
    encoder = build_encoder(cfg, splits.train.feature_shape)
    loss = build_loss(cfg)
    ks, distance = eval_metric_names(cfg)
    metrics: dict[str, Any] = {f"recall_at_{k}": RetrievalRecallAtK(k, distance) for k in ks}
    metrics["map_at_r"] = MeanAveragePrecisionAtR(distance)
    metrics["r_precision"] = RPrecision(distance)
    kwargs = {key: value for key, value in model.items() if key not in ("encoder", "loss")}
    return _call("model", Registered(EmbeddingModel), {**kwargs, "eval_metrics": metrics}, encoder, loss)


def build_sampler(cfg: DictConfig, labels: torch.Tensor, seed: int) -> Any:
    """Build ``sampler`` for the train labels; ``num_replicas``/``rank`` come from the launcher."""
    entry, name, kwargs, section = _named("sampler", cfg, "sampler", SAMPLERS)
    kwargs.setdefault("seed", seed)
    if name == "pk":
        return _call("sampler", entry, kwargs, labels)
    fraction = section.get("primary_fraction", entry.extra["primary_fraction"])
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0 < fraction < 1:
        raise ConfigError(f"sampler.primary_fraction must be a number in (0, 1), got {fraction!r}.")
    secondary, primary = stratified_split(labels, float(fraction), seed=int(kwargs["seed"]))
    return _call("sampler", entry, kwargs, primary, secondary)


def _dataloader_kwargs(cfg: DictConfig) -> dict[str, Any]:
    section = _section(cfg, "dataloader", "dataloader")
    valid = [key for key in _parameters(DataLoader) if key not in _DATALOADER_OWNED]
    _check_keys("dataloader", section, valid, "the train DataLoader")
    workers = section.get("num_workers", 0)
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 0:
        raise ConfigError(f"dataloader.num_workers must be an integer >= 0, got {workers!r}.")
    if section.get("pin_memory") is None:  # null or absent: pin when there is a GPU to copy to
        section["pin_memory"] = torch.cuda.is_available()
    return section


def build_train_dataloader(cfg: DictConfig, store: TensorStore, seed: int) -> DataLoader:
    """The train loader: ``IndexDataset`` + the sampler + ``GatherCollate`` over the store."""
    sampler = build_sampler(cfg, store.labels, seed)
    kwargs = _dataloader_kwargs(cfg)
    try:
        return build_dataloader(
            IndexDataset(store.labels), sampler, collate_fn=GatherCollate(store), **kwargs
        )
    except (TypeError, ValueError) as error:
        raise ConfigError(f"dataloader: DataLoader({kwargs}) rejected the config: {error}") from error


def build_eval_dataloader(store: TensorStore, batch_size: int) -> DataLoader:
    """The query loader: the test split, sharded over ranks without shuffling (Composer drops the padding)."""
    dataset = IndexDataset(store.labels)
    sampler = dist.get_sampler(dataset, drop_last=False, shuffle=False)
    # No larger than one rank's share, so Composer's microbatching never warns about a short batch.
    batch_size = max(1, min(batch_size, math.ceil(len(dataset) / dist.get_world_size())))
    return DataLoader(dataset, batch_size=batch_size, sampler=sampler, collate_fn=GatherCollate(store))


def build_optimizer(cfg: DictConfig, model: torch.nn.Module) -> torch.optim.Optimizer:
    """Build ``optimizer`` over the model's parameters."""
    entry, _, kwargs, _ = _named("optimizer", cfg, "optimizer", OPTIMIZERS)
    if "betas" in kwargs and isinstance(kwargs["betas"], list):
        kwargs["betas"] = tuple(kwargs["betas"])
    return _call("optimizer", entry, kwargs, model.parameters())


def build_scheduler(cfg: DictConfig) -> Any | None:
    """Build ``scheduler`` (a Composer scheduler), or ``None`` when the section is null or absent."""
    if cfg.get("scheduler") is None:
        return None
    entry, _, kwargs, _ = _named("scheduler", cfg, "scheduler", SCHEDULERS)
    return _call("scheduler", entry, kwargs)


def _build_set(path: str, cfg: DictConfig, registry: Mapping[str, Any]) -> list[Any]:
    """Build every entry of a ``{registry_name: kwargs}`` section; null entries are off."""
    built = []
    for name, kwargs in _section(cfg, path, path).items():
        if kwargs is None:
            continue
        entry = _lookup(f"{path}.{name}", name, registry)
        if not isinstance(kwargs, Mapping):
            raise ConfigError(
                f"{path}.{name} must be a mapping of keyword arguments ({{}} for the defaults) or null, "
                f"got {kwargs!r}."
            )
        arguments = _kwargs(f"{path}.{name}", dict(kwargs), entry, repr(name))
        missing = [arg for arg in entry.required_keys() if arg not in arguments]
        if missing:
            raise ConfigError(
                f"{path}.{name} needs the key {missing[0]!r}; valid keys: {entry.valid_keys()}."
            )
        built.append(_call(f"{path}.{name}", entry, arguments))
    return built


def build_algorithms(cfg: DictConfig) -> list[Any]:
    """Build ``algorithms`` (e.g. ``hard_negative_mining``)."""
    return _build_set("algorithms", cfg, ALGORITHMS)


def build_callbacks(cfg: DictConfig) -> list[Any]:
    """Build ``callbacks`` (e.g. ``set_sampler_epoch``)."""
    return _build_set("callbacks", cfg, CALLBACKS)


def build_loggers(cfg: DictConfig, run_dir: Path) -> list[Any]:
    """Build ``loggers``; a ``file`` logger writes into the run directory unless given a ``filename``."""
    section = _section(cfg, "loggers", "loggers")
    if isinstance(section.get("file"), Mapping) and "filename" not in section["file"]:
        section["file"] = {**section["file"], "filename": str(run_dir / "logs-rank{rank}.txt")}
    return _build_set("loggers", OmegaConf.create({"loggers": section}), LOGGERS)


def _trainer_kwargs(cfg: DictConfig, run_dir: Path) -> dict[str, Any]:
    section = _section(cfg, "trainer", "trainer")
    owned = [key for key in section if key in _TRAINER_OWNED]
    if owned:
        raise ConfigError(
            f"trainer: key {owned[0]!r} is set by the {_TRAINER_OWNED[owned[0]]!r} section, not here."
        )
    valid = [key for key in _parameters(Trainer) if key not in _TRAINER_OWNED]
    _check_keys("trainer", section, valid, "composer.Trainer")
    if section.get("max_duration") is None:
        raise ConfigError("trainer.max_duration is required, e.g. '60ep' or '500ba'.")
    _time("trainer.max_duration", section["max_duration"], (TimeUnit.EPOCH, TimeUnit.BATCH, TimeUnit.SAMPLE))
    load_path = section.get("load_path")
    if (
        load_path is not None
        and "://" not in str(load_path)
        and not Path(str(load_path)).expanduser().exists()
    ):
        raise ConfigError(f"trainer.load_path {section['load_path']!r} does not exist.")
    defaults = {
        "save_folder": str(run_dir / "checkpoints"),
        "save_overwrite": True,  # the run directory is an output folder: a re-run replaces it
        "run_name": run_dir.name or "run",
        "progress_bar": True,
        "log_to_console": False,
    }
    return {**defaults, **section}


def _seed(cfg: DictConfig) -> int:
    seed = cfg.get("seed", 0)
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ConfigError(f"seed must be an integer >= 0, got {seed!r}.")
    return seed


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
        gallery (RetrievalGallery | None): The callback that attaches the train gallery at ``EVAL_START``.
        seed (int): The run's seed.
    """

    config: DictConfig
    run_dir: Path
    trainer: Trainer
    model: EmbeddingModel
    splits: DatasetSplits
    train_dataloader: DataLoader
    ks: tuple[int, ...]
    distance: str
    gallery: RetrievalGallery | None
    seed: int


def default_run_dir(config_path: str | os.PathLike[str] | None) -> Path:
    """``runs/<config file stem>`` (``runs/default`` without a file)."""
    return Path("runs") / (Path(config_path).stem if config_path is not None else "default")


def build_run(cfg: DictConfig, run_dir: str | os.PathLike[str] | None = None) -> TrainingRun:
    """Build the data, model, loaders, optimizer, scheduler, algorithms, callbacks and the ``Trainer``.

    Args:
        cfg (DictConfig): A config from :func:`load_config`.
        run_dir (str | os.PathLike, optional): Output directory; overrides the config's ``run_dir``.
            Default: the config's ``run_dir``, else ``runs/default``.

    Returns:
        TrainingRun: The trainer and what it was built from. Nothing is written to disk yet, except what
        Composer's ``Trainer`` creates (the checkpoint folder on rank 0; a ``load_path`` is loaded).

    Raises:
        ConfigError: If a key or value is wrong.
    """
    cfg = load_config(cfg)
    directory = Path(run_dir if run_dir is not None else cfg.get("run_dir") or default_run_dir(None))
    cfg.run_dir = str(directory)
    seed = _seed(cfg)
    evaluation = _evaluation(cfg)
    reproducibility.seed_all(seed)
    splits = build_data(cfg)
    model = build_model(cfg, splits)
    train_loader = build_train_dataloader(cfg, splits.train, seed)
    optimizer = build_optimizer(cfg, model)
    scheduler = build_scheduler(cfg)
    algorithms = build_algorithms(cfg)
    callbacks = build_callbacks(cfg)
    loggers = build_loggers(cfg, directory)
    trainer_kwargs = _trainer_kwargs(cfg, directory)

    gallery = None
    eval_kwargs: dict[str, Any] = {}
    if evaluation["interval"] is not None:
        gallery = RetrievalGallery(
            splits.train, evaluator_label="test", batch_size=evaluation["gallery_batch_size"]
        )
        callbacks.append(gallery)
        interval = evaluation["interval"]
        eval_kwargs = {
            "eval_dataloader": Evaluator(
                label="test", dataloader=build_eval_dataloader(splits.test, evaluation["batch_size"])
            ),
            "eval_interval": f"{interval}ep" if isinstance(interval, int) else interval,
        }
    try:
        trainer = Trainer(
            model=model,
            train_dataloader=train_loader,
            optimizers=optimizer,
            schedulers=scheduler,
            algorithms=algorithms,
            callbacks=callbacks,
            loggers=loggers,
            seed=seed,
            **eval_kwargs,
            **trainer_kwargs,
        )
    except (TypeError, ValueError) as error:
        section = _section(cfg, "trainer", "trainer")
        raise ConfigError(f"trainer: composer.Trainer rejected the config {section}: {error}") from error
    return TrainingRun(
        config=cfg,
        run_dir=directory,
        trainer=trainer,
        model=model,
        splits=splits,
        train_dataloader=train_loader,
        ks=tuple(evaluation["ks"]),
        distance=evaluation["distance"],
        gallery=gallery,
        seed=seed,
    )
