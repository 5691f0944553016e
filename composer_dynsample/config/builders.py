"""Builders: one function per config section, each turning its section into the object it names.

Every builder takes the whole config and reads only its own section; the short names a section may
use live in the tables of :mod:`~composer_dynsample.config.names`, and any other class or
function is reachable by a ``_component_`` dotted path (see :mod:`composer_dynsample.config.components`).
What the builder supplies itself (a sampler's labels, the optimizer's parameters, an encoder's input
sizes read off the data) is the same for a registered name and for a ``_component_``:

- ``data``: ``target(**keys)`` returns a :class:`~composer_dynsample.data.DatasetSplits`; a text
  loader's tokenizer is the run's ``RUN_DIR/tokenizer.json`` when it has one, else, for a transformer
  of a model folder (``model.encoder.path``), the folder's, whose ``max_seq_length`` is the default
  ``max_length`` too (see :func:`build_data`).
- ``model.encoder``: ``target(**keys)``; ``in_features``, ``in_channels``, ``input_length`` and
  ``input_size`` are filled from the data's item shape, and a text encoder's ``vocab_size`` from the
  tokenizer, when the target takes them and the config leaves them out; ``two_tower`` builds its
  ``query_encoder`` and ``passage_encoder`` sections as ``model.encoder`` sections.
- ``model.loss``: ``target(**keys)``, e.g. ``pytorch_metric_learning.losses.ArcFaceLoss``; a loss
  with parameters trains them (the model holds it as ``loss_fn``).
- ``sampler``: ``target(train_labels, **keys)``, with ``seed`` from the top level when it takes one.
- ``dataloader``: ``target(index_dataset, batch_sampler, collate_fn=..., **keys)``.
- ``optimizer``: ``target(model.parameters(), **keys)``; ``scheduler``: ``target(**keys)``.
- ``algorithms``, ``callbacks``, ``loggers``: ``{label: {keys}}``, the label a registry name or, with
  a ``_component_`` among the keys, any label.

The ``model`` section's builders (``model.encoder``, ``model.loss``, the model) are in
:mod:`~composer_dynsample.config.model_builders`, the evaluation's in
:mod:`~composer_dynsample.config.evaluation`; :func:`~composer_dynsample.config.checks.check_config`
checks a config without building it.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from composer.core import DataSpec
from omegaconf import DictConfig, OmegaConf
from torch.utils.data import DataLoader

from composer_dynsample.config.components import (
    ConfigError,
    Registered,
    call,
    check_keys,
    import_component,
    resolve_entry,
    resolve_set,
)
from composer_dynsample.config.loading import collate_padding, dataloader_config, section
from composer_dynsample.config.mix_data import build_mix, build_mixed_sampler, is_mix
from composer_dynsample.config.model_checks import folder_data_defaults
from composer_dynsample.config.names import (
    ALGORITHMS,
    CALLBACKS,
    DATASETS,
    LOADER_OWNED,
    LOGGERS,
    OPTIMIZERS,
    SAMPLER_RESERVED,
    SAMPLERS,
    SCHEDULERS,
)
from composer_dynsample.config.parameters import parameters
from composer_dynsample.config.prompts import data_prompts, folder_prompts
from composer_dynsample.config.run_tokenizer import run_tokenizer
from composer_dynsample.data import (
    DatasetSplits,
    GatherCollate,
    IndexDataset,
    TensorStore,
    TextCollate,
    TextStore,
    stratified_split,
    text_data_spec,
)
from composer_dynsample.data.mix import MixedTextStore
from composer_dynsample.samplers.dataloader import BatchSamplerDataLoader

__all__ = [
    "build_algorithms",
    "build_callbacks",
    "build_data",
    "build_loggers",
    "build_optimizer",
    "build_sampler",
    "build_scheduler",
    "build_train_dataloader",
    "composer_dataloader",
]


def build_data(cfg: DictConfig) -> DatasetSplits:
    """Load the dataset the ``data`` section names, with its other keys.

    A text loader left without a ``tokenizer`` reads the one of the run it continues (see
    :func:`~composer_dynsample.config.run_tokenizer.run_tokenizer`), so a resumed, evaluated or exported
    model meets the ids it was trained on; else, when ``model.encoder`` is a transformer of a model
    folder, the folder's tokenizer, and its ``max_seq_length`` as ``max_length`` when that is unset too
    (see :func:`~composer_dynsample.config.model_checks.folder_data_defaults`).
    An error of the loader about the data (a file, its line and column) is one line naming ``data``.

    Raises:
        ConfigError: If a key or value is wrong, a data file is missing or malformed, or the model folder
            refuses the data's tokenizer (see :func:`~composer_dynsample.config.checks.check_config`).
    """
    if is_mix(cfg):  # several data sets, each its own data section (config/mix_data.py)
        return build_mix(cfg, build_data)
    entry, name, kwargs, extras = resolve_entry("data", section(cfg, "data", "data"), DATASETS)
    if "prompts" in parameters(entry.target):
        kwargs["prompts"] = data_prompts(cfg, kwargs.get("prompts"), extras.get("prompt_names"))
    if "run_prompts" in entry.reserved:  # tokenized data: the prompts the model folder gives a file run
        kwargs["run_prompts"] = folder_prompts(cfg)
    found = None
    if "tokenizer" in parameters(entry.target) and kwargs.get("tokenizer") is None:
        found = run_tokenizer(cfg)
        if found is not None:
            kwargs["tokenizer"] = str(found)
    for key, value in folder_data_defaults(cfg, tokenizer=found is None).items():
        if kwargs.get(key) is None:
            kwargs[key] = value
            if key == "max_length":  # the run's config.yaml records the length used, the folder's too
                OmegaConf.update(cfg, "data.max_length", value, force_add=True)
    try:
        splits = call("data", entry, kwargs)
    except FileNotFoundError as error:
        raise ConfigError(f"data: {error}") from error
    except ConfigError as error:
        cause = error.__cause__
        if not isinstance(cause, ValueError):
            raise
        raise ConfigError(f"data: {cause}") from cause  # the loader names the file, line and column
    if not isinstance(splits, DatasetSplits):
        raise ConfigError(
            f"data: {name} returned {type(splits).__name__}, not composer_dynsample.data.DatasetSplits."
        )
    return splits


def build_sampler(cfg: DictConfig, labels: torch.Tensor, seed: int, store: Any = None) -> Any:
    """Build ``sampler`` for the train labels; ``num_replicas``/``rank`` come from the launcher, and a
    sampler of pairs (``mined_negatives``) reads which rows are passages and their text ids off ``store``;
    a mix of sources (a :class:`~composer_dynsample.data.mix.MixedTextStore`) gets a ``MixedBatchSampler``
    over each source's own sampler (:func:`~composer_dynsample.config.mix_data.build_mixed_sampler`)."""
    if isinstance(store, MixedTextStore):
        return build_mixed_sampler(cfg, store, seed, build_sampler)
    values = section(cfg, "sampler", "sampler")
    entry, name, kwargs, extras = resolve_entry("sampler", values, SAMPLERS, reserved=SAMPLER_RESERVED)
    if "seed" in parameters(entry.target):
        kwargs.setdefault("seed", seed)
    if "is_passage" in parameters(entry.target):
        kwargs.update(_pair_rows(name, store))
    if "primary_fraction" not in entry.extra:  # every sampler but the two-stream one takes the labels
        return call("sampler", entry, kwargs, labels)
    fraction = extras.get("primary_fraction", entry.extra["primary_fraction"])
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0 < fraction < 1:
        raise ConfigError(f"sampler.primary_fraction must be a number in (0, 1), got {fraction!r}.")
    secondary, primary = stratified_split(labels, float(fraction), seed=int(kwargs["seed"]))
    return call("sampler", entry, kwargs, primary, secondary)


def _pair_rows(name: str, store: Any) -> dict[str, Any]:
    """``is_passage`` and ``duplicate_ids`` of a pairs store's sampled rows, or a ConfigError."""
    is_query = getattr(store, "is_query", None)
    if is_query is None or not bool(np.asarray(is_query).any()):
        raise ConfigError(
            f"sampler: {name!r} builds batches of (query, passage) pairs and needs pairs data (data.name: "
            "code_search or pairs, or a TextStore with is_query); use sampler.name: pk for labelled samples."
        )
    size = len(store)
    return {
        "is_passage": ~np.asarray(is_query[:size], dtype=bool),
        "duplicate_ids": np.asarray(store.text_group[:size]),  # pairs linked by a shared text: one group
    }


def build_train_dataloader(cfg: DictConfig, store: TensorStore | TextStore, seed: int) -> DataLoader:
    """The train loader: ``IndexDataset`` + the sampler + ``GatherCollate`` (``TextCollate`` for texts) over the store.

    A text batch's length is padded up to ``dataloader.pad_to_multiple_of`` (when set). Give the
    Trainer :func:`composer_dataloader` of it: Composer cannot size a text batch by itself.
    """
    sampler = build_sampler(cfg, store.labels, seed, store)
    component, kwargs = dataloader_config(cfg)
    if component is None:
        entry = Registered(BatchSamplerDataLoader, reserved=LOADER_OWNED)
    else:
        entry = Registered(import_component("dataloader._component_", component), reserved=LOADER_OWNED)
        if not entry.accepts_any_key():
            check_keys("dataloader", kwargs, entry.valid_keys(), component)
    if isinstance(store, TextStore):
        collate: Any = TextCollate(store, pad_to_multiple_of=collate_padding(cfg))
    else:
        collate = GatherCollate(store)
    kwargs = {**kwargs, "collate_fn": collate}
    return call("dataloader", entry, kwargs, IndexDataset(store.labels), sampler)


def composer_dataloader(loader: DataLoader) -> DataLoader | DataSpec:
    """What the Trainer gets for a train loader: a text loader's :func:`~composer_dynsample.data.text_data_spec`
    (which sizes its batches and keeps given negatives whole), any other loader as it is."""
    return text_data_spec(loader) if isinstance(getattr(loader, "collate_fn", None), TextCollate) else loader


def build_optimizer(cfg: DictConfig, model: torch.nn.Module) -> torch.optim.Optimizer:
    """Build ``optimizer`` over the model's parameters (the loss's too, when it has any)."""
    values = section(cfg, "optimizer", "optimizer")
    entry, _, kwargs, _ = resolve_entry("optimizer", values, OPTIMIZERS, reserved=("params",))
    if "betas" in kwargs and isinstance(kwargs["betas"], list):
        kwargs["betas"] = tuple(kwargs["betas"])
    return call("optimizer", entry, kwargs, model.parameters())


def build_scheduler(cfg: DictConfig) -> Any | None:
    """Build ``scheduler`` (a Composer scheduler), or ``None`` when the section is null or absent."""
    if cfg.get("scheduler") is None:
        return None
    entry, _, kwargs, _ = resolve_entry("scheduler", section(cfg, "scheduler", "scheduler"), SCHEDULERS)
    return call("scheduler", entry, kwargs)


def _build_set(
    path: str,
    values: Mapping[str, Any],
    registry: Mapping[str, Any],
    supplied: Mapping[str, Any] | None = None,
) -> list[Any]:
    """Build every entry of a ``{label: keys}`` section; null entries are off."""
    return [
        call(where, entry, kwargs) for where, entry, kwargs in resolve_set(path, values, registry, supplied)
    ]


def build_algorithms(cfg: DictConfig, supplied: Mapping[str, Any] | None = None) -> list[Any]:
    """Build ``algorithms`` (e.g. ``hard_negative_mining``); ``supplied`` fills the arguments of those names
    that an algorithm takes and its section leaves out (``build_run``: an embedding table's
    ``refresh_batch_size``, the evaluation's ``gallery_batch_size``)."""
    return _build_set("algorithms", section(cfg, "algorithms", "algorithms"), ALGORITHMS, supplied)


def build_callbacks(cfg: DictConfig) -> list[Any]:
    """Build ``callbacks`` (e.g. ``set_sampler_epoch``)."""
    return _build_set("callbacks", section(cfg, "callbacks", "callbacks"), CALLBACKS)


def build_loggers(cfg: DictConfig, run_dir: Path) -> list[Any]:
    """Build ``loggers``; a ``file`` logger writes into the run directory unless given a ``filename``."""
    values = section(cfg, "loggers", "loggers")
    if isinstance(values.get("file"), Mapping) and "filename" not in values["file"]:
        values["file"] = {**values["file"], "filename": str(run_dir / "logs-rank{rank}.txt")}
    return _build_set("loggers", values, LOGGERS)
