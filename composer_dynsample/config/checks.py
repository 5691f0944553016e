"""Check a config before anything is built or loaded: :func:`check_config`, cheapest first.

The keys and value types of every section are checked against the signatures of their targets: the
targets of ``data``, ``model``, ``sampler`` and ``optimizer`` are imported (torch at most), those that
import Composer (algorithms, callbacks, loggers, the scheduler, the ``Trainer`` and the
:class:`~composer_dynsample.EmbeddingModel`) are read from source (:mod:`.signatures`). The ``model``
section's checks are in :mod:`.model_checks`; the builders check the rest as they build.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from composer_dynsample.config.components import (
    COMPONENT_KEY,
    ConfigError,
    check_keys,
    check_types,
    resolve_entry,
    resolve_set,
)
from composer_dynsample.config.loading import dataloader_config, evaluation_config, run_options, section
from composer_dynsample.config.matryoshka import split_loss_section
from composer_dynsample.config.mix_data import check_mix, is_mix
from composer_dynsample.config.model_checks import (
    check_encoder,
    check_model_folder,
    check_model_keys,
    check_positions,
)
from composer_dynsample.config.names import (
    ALGORITHMS,
    CALLBACKS,
    DATASETS,
    LOGGERS,
    LOSSES,
    OPTIMIZERS,
    SAMPLER_RESERVED,
    SAMPLERS,
    SCHEDULERS,
)
from composer_dynsample.config.sampler_table import check_sampler_table
from composer_dynsample.config.signatures import SourceRegistry, source_signature
from composer_dynsample.validation import check_time

__all__ = ["TRAINER_OWNED", "check_config", "check_trainer_basics"]

# Trainer arguments the builders construct from other sections.
TRAINER_OWNED = {
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


def check_config(cfg: DictConfig) -> None:
    """Check what can be checked before anything is built or loaded, cheapest first.

    Run options, ``evaluation``, the trainer's time and checkpoint path, then the keys and value types of
    ``data``, ``model.encoder``, ``model.loss``, ``sampler``, ``dataloader`` and ``optimizer`` against their
    targets' signatures, ``data.max_length`` against a transformer's positions, and a model folder's
    pooling and tokenizer against the config (its JSON files read, no weights): an error there answers
    without loading data, and with at most torch imported (Composer only when a section names a
    Composer class). The builders check the rest as they build.

    Raises:
        ConfigError: The first problem found, naming the key.
    """
    run_options(cfg)
    evaluation_config(cfg)
    check_trainer_basics(section(cfg, "trainer", "trainer"))
    model, algorithms = section(cfg, "model", "model"), section(cfg, "algorithms", "algorithms")
    mix = is_mix(cfg)
    loss = split_loss_section(section(model, "loss", "model.loss"))[0]
    if not mix:  # a mix's sources are checked each with its own loss and sampler (check_mix, below)
        check_loss_pool(loss, algorithms)  # before resolve_entry takes the section's name
    sections = [
        ("data", {} if mix else section(cfg, "data", "data"), DATASETS, {}, {}),
        ("model.loss", loss, LOSSES, {}, {}),
        ("sampler", section(cfg, "sampler", "sampler"), SAMPLERS, {}, {"reserved": SAMPLER_RESERVED}),
        ("optimizer", section(cfg, "optimizer", "optimizer"), OPTIMIZERS, {}, {"reserved": ("params",)}),
    ]
    for path, values, registry, supplied, options in sections:
        if values:
            entry, _, kwargs, _ = resolve_entry(path, values, registry, supplied=supplied, **options)
            check_types(path, entry, kwargs)
    check_encoder("model.encoder", section(model, "encoder", "model.encoder"))
    if mix:  # each source's data, sampler and loss sections, and its data against the model
        check_mix(cfg, _check_source)
    else:
        _check_data_against_model(cfg)
    dataloader_config(cfg)
    _check_from_source(cfg, model)
    if not mix:
        check_sampler_table(section(cfg, "sampler", "sampler"), algorithms)


def check_loss_pool(loss: Mapping[str, Any], algorithms: Mapping[str, Any]) -> None:
    """Refuse ``info_nce`` with ``negatives: passages`` beside a pool beyond the batch (the hard-negative
    mining algorithm's ``cross_rank`` or ``memory_size``): that pool's rows carry no query flags, so the loss
    would stop at its first step (on more than one rank); said here, before anything is built.

    Raises:
        ConfigError: Naming both keys and the way out.
    """
    mining = algorithms.get("hard_negative_mining")
    if (
        loss.get("name") != "info_nce"
        or loss.get("negatives") != "passages"
        or not isinstance(mining, Mapping)
    ):
        return
    pools = [key for key in ("cross_rank", "memory_size") if mining.get(key)]
    if pools:
        raise ConfigError(
            f"model.loss.negatives=passages scores a batch's queries against its passages, and "
            f"algorithms.hard_negative_mining.{pools[0]} adds a pool beyond the batch whose rows are neither: "
            "use model.loss.negatives=pool (model.loss.symmetric=false) with it, or turn the pool off."
        )


def _check_data_against_model(cfg: DictConfig) -> None:
    """``data.max_length`` against a transformer's positions, the data not loaded, and a model folder's
    pooling and tokenizer against the config."""
    check_positions(cfg)
    check_model_folder(cfg)


def _check_source(cfg: DictConfig) -> None:
    """The keys and value types of a source's ``data``, ``sampler`` and ``loss`` sections, and its data against
    the model (the source's config: see :func:`~composer_dynsample.config.mix_data.source_configs`)."""
    loss = split_loss_section(section(section(cfg, "model", "model"), "loss", "model.loss"))[0]
    check_loss_pool(loss, section(cfg, "algorithms", "algorithms"))  # before resolve_entry takes its name
    for path, registry, options, values in (
        ("data", DATASETS, {}, section(cfg, "data", "data")),
        ("sampler", SAMPLERS, {"reserved": SAMPLER_RESERVED}, section(cfg, "sampler", "sampler")),
        ("loss", LOSSES, {}, loss),
    ):
        if values:
            entry, _, kwargs, _ = resolve_entry(path, values, registry, **options)
            check_types(path, entry, kwargs)
    _check_data_against_model(cfg)


def _check_from_source(cfg: DictConfig, model: Mapping[str, Any]) -> None:
    """The keys of the sections whose targets import Composer, against signatures read from source."""
    for path, registry in (("algorithms", ALGORITHMS), ("callbacks", CALLBACKS), ("loggers", LOGGERS)):
        values = section(cfg, path, path)
        named = {  # a dotted _component_ of the user's is checked by the builder, once imported
            label: keys
            for label, keys in values.items()
            if not (isinstance(keys, Mapping) and keys.get(COMPONENT_KEY, label) not in (*registry, label))
        }
        resolve_set(path, named, SourceRegistry(registry))
    scheduler = cfg.get("scheduler")
    if scheduler is not None:
        values = section(cfg, "scheduler", "scheduler")
        if values.get(COMPONENT_KEY, values.get("name")) in SCHEDULERS:
            resolve_entry("scheduler", values, SourceRegistry(SCHEDULERS))
    signature = source_signature("composer_dynsample.models.embedding_model", "EmbeddingModel")
    if signature is not None:
        check_model_keys(model, signature.parameters)
    signature = source_signature("composer.trainer.trainer", "Trainer")
    if signature is not None:
        valid = [key for key in signature.parameters if key not in TRAINER_OWNED]
        check_keys("trainer", section(cfg, "trainer", "trainer"), valid, "composer.Trainer")


def check_trainer_basics(values: Mapping[str, Any]) -> None:
    """The trainer keys the builders own, ``max_duration`` and a local ``load_path``."""
    owned = [key for key in values if key in TRAINER_OWNED]
    if owned:
        raise ConfigError(
            f"trainer: key {owned[0]!r} is set by the {TRAINER_OWNED[owned[0]]!r} section, not here."
        )
    if values.get("max_duration") is None:
        raise ConfigError("trainer.max_duration is required, e.g. '60ep' or '500ba'.")
    try:
        number, _ = check_time("trainer.max_duration", values["max_duration"], ("ep", "ba", "sp"))
    except ValueError as error:
        raise ConfigError(str(error)) from error
    if number == 0:
        raise ConfigError(f"trainer.max_duration must be greater than zero, got {values['max_duration']!r}.")
    load_path = values.get("load_path")
    if (
        load_path is not None
        and "://" not in str(load_path)
        and not Path(str(load_path)).expanduser().exists()
    ):
        raise ConfigError(f"trainer.load_path {values['load_path']!r} does not exist.")
