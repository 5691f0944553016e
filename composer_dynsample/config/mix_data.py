"""The ``data: {name: mix}`` section: several data sets in one run, each loaded by its own data section.

.. code-block:: yaml

    data:
      name: mix
      sampling: proportional        # or round_robin (sentence-transformers' MultiDatasetBatchSamplers)
      batches_per_draw: 1           # consecutive batches of one source: the number of ranks for cross-rank pools
      sources:
        code:                       # any data section, plus the mix's own keys: weight and sampler
          name: code_search
          max_length: 128
        qa:
          name: pairs
          path: qa.jsonl
          test_path: qa_test.jsonl
          weight: 2                 # proportional only: the source's share of the batches
          sampler: {name: pk, classes_per_batch: 16, samples_per_class: 2}   # default: the run's sampler

Each source is loaded as the run's ``data`` section would be with that source's keys (its tokenizer and
``max_length`` defaults the model folder's, its prompts its own), and its errors name it
(``data.sources.qa: ...``). The sources are joined by :func:`~composer_dynsample.data.mix.mix_text_splits`;
the train loader's sampler is a :class:`~composer_dynsample.samplers.mixed.MixedBatchSampler` over each
source's own sampler (:func:`build_mixed_sampler`). A source's sampler may draw from the embedding table
(``mined_negatives``, ``neighbours``, ``hard_class_pk``): the run's one ``algorithms.embedding_table`` feeds
the mix, which hands each such sampler its own source's rows; without a table it is refused as the run's is.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from typing import Any

from omegaconf import DictConfig, OmegaConf

from composer_dynsample.config.components import ConfigError
from composer_dynsample.config.loading import section
from composer_dynsample.config.sampler_table import check_sampler_table

__all__ = [
    "MIX",
    "build_mix",
    "build_mixed_sampler",
    "build_source_losses",
    "check_mix_pools",
    "for_each_source",
    "is_mix",
    "one_source",
    "source_configs",
]

MIX = "mix"
_MIX_KEYS = ("name", "sources", "sampling", "batches_per_draw")
_SOURCE_KEYS = ("weight", "sampler", "loss")  # a source's keys that are the mix's, not its loader's


def is_mix(cfg: DictConfig | Mapping[str, Any]) -> bool:
    """Whether the config's ``data`` section is a mix of sources."""
    return section(cfg, "data", "data").get("name") == MIX


def _sources(cfg: DictConfig | Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """The ``data.sources`` mapping, checked."""
    values = section(cfg, "data", "data")
    unknown = sorted(set(values) - set(_MIX_KEYS))
    if unknown:
        raise ConfigError(
            f"data: unknown key {unknown[0]!r} of a mix; a mix takes {', '.join(_MIX_KEYS)} (the loaders' keys "
            "go in each source: data.sources.NAME.KEY)."
        )
    sources = values.get("sources")
    if not isinstance(sources, Mapping) or not sources:
        raise ConfigError(
            "data.sources must map source names to data sections, e.g. {code: {name: code_search}, "
            f"qa: {{name: pairs, path: qa.jsonl}}}}, got {sources!r}."
        )
    for name, source in sources.items():
        if not isinstance(name, str) or not name.isidentifier():
            raise ConfigError(
                f"data.sources: a source name must be an identifier (letters, digits, _), got {name!r}."
            )
        if not isinstance(source, Mapping) or ("name" not in source and "_component_" not in source):
            raise ConfigError(f"data.sources.{name} must be a data section with a name, got {source!r}.")
        if source.get("name") == MIX:
            raise ConfigError(f"data.sources.{name}: a source cannot be a mix itself; list its sources here.")
    return {str(name): dict(source) for name, source in sources.items()}


def source_configs(cfg: DictConfig) -> dict[str, DictConfig]:
    """Each source's config: the run's, with the source's data section as ``data``, its ``sampler`` (when it
    gives one) as ``sampler`` and its ``loss`` as ``model.loss``."""
    configs = {}
    for name, source in _sources(cfg).items():
        one = copy.deepcopy(cfg)
        OmegaConf.update(one, "data", {k: v for k, v in source.items() if k not in _SOURCE_KEYS}, merge=False)
        if source.get("sampler") is not None:
            OmegaConf.update(one, "sampler", source["sampler"], merge=False)
        if source.get("loss") is not None:
            OmegaConf.update(one, "model.loss", source["loss"], merge=False)
        configs[name] = one
    return configs


def _options(cfg: DictConfig) -> dict[str, Any]:
    """The mix's ``sampling``, ``batches_per_draw`` and the sources' ``weights``, checked."""
    from composer_dynsample.samplers.mixed import MIX_SAMPLING

    values, sources = section(cfg, "data", "data"), _sources(cfg)
    sampling = values.get("sampling", "proportional")
    if sampling not in MIX_SAMPLING:
        raise ConfigError(f"data.sampling must be one of {', '.join(MIX_SAMPLING)}, got {sampling!r}.")
    per_draw = values.get("batches_per_draw", 1)
    if isinstance(per_draw, bool) or not isinstance(per_draw, int) or per_draw < 1:
        raise ConfigError(f"data.batches_per_draw must be a positive integer, got {per_draw!r}.")
    given = {name: source["weight"] for name, source in sources.items() if source.get("weight") is not None}
    for name, weight in given.items():
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or weight <= 0:
            raise ConfigError(f"data.sources.{name}.weight must be a positive number, got {weight!r}.")
    if given and sampling == "round_robin":
        raise ConfigError(
            f"data.sources.{next(iter(given))}.weight: weights are for data.sampling: proportional; round_robin "
            "takes one batch of each source in turn."
        )
    weights = [float(sources[name].get("weight") or 1.0) for name in sources] if given else None
    return {"sampling": sampling, "batches_per_draw": per_draw, "weights": weights}


def _renamed(error: ConfigError, name: str) -> ConfigError:
    """The error of one source's section, its ``data`` path named ``data.sources.NAME``."""
    message = str(error)
    if message.startswith("data"):
        message = f"data.sources.{name}" + message[len("data") :]
    else:
        message = f"data.sources.{name}: {message}"
    return ConfigError(message)


def check_mix(cfg: DictConfig, check_one: Callable[[DictConfig], None]) -> None:
    """Check every source's data section with ``check_one`` (the checks of one ``data`` section), and that
    a source's sampler that draws from the embedding table has one."""
    _options(cfg)
    for name, one in source_configs(cfg).items():
        try:
            check_one(one)
            _check_source_table(one)
        except ConfigError as error:
            raise _renamed(error, name) from error


def _check_source_table(one: DictConfig) -> None:
    """A source's model-aware sampler without an ``algorithms.embedding_table`` is refused, as the run's is."""
    check_sampler_table(section(one, "sampler", "sampler"), section(one, "algorithms", "algorithms"))


def build_mix(cfg: DictConfig, build_one: Callable[[DictConfig], Any]) -> Any:
    """Load every source with ``build_one`` (:func:`~composer_dynsample.config.builders.build_data` of one
    data section) and join them; the ``max_length`` a source took from the model folder is written back
    into its section (the run's ``config.yaml`` records it)."""
    from composer_dynsample.data.mix import mix_text_splits

    options, loaded = _options(cfg), {}
    for name, one in source_configs(cfg).items():
        try:
            loaded[name] = build_one(one)
        except ConfigError as error:
            raise _renamed(error, name) from error
        length = one.data.get("max_length")
        if length is not None and cfg.data.sources[name].get("max_length") is None:
            OmegaConf.update(cfg, f"data.sources.{name}.max_length", length, force_add=True)
    try:
        return mix_text_splits(loaded, **options)
    except ValueError as error:
        raise ConfigError(f"data: {error}") from error


def for_each_source(cfg: DictConfig, splits: Any, check: Callable[[DictConfig, Any], None]) -> None:
    """``check(config, splits)`` of the run's data, or of each source of a mix with its own config (its
    errors naming the source)."""
    sources = getattr(splits, "sources", None)
    if not is_mix(cfg) or not sources:
        check(cfg, splits)
        return
    for name, one in source_configs(cfg).items():
        try:
            check(one, sources[name])
        except ConfigError as error:
            raise ConfigError(f"data.sources.{name}: {error}") from error


def build_source_losses(cfg: DictConfig, build_one: Callable[[DictConfig], Any]) -> Any | None:
    """A :class:`~composer_dynsample.losses.per_source.PerSourceLoss` of each source's ``model.loss`` (its
    ``loss``, else the run's), built by ``build_one`` (:func:`~composer_dynsample.config.model_builders.
    build_loss`); ``None`` when no source gives a loss (the run's loss serves every source)."""
    if not is_mix(cfg) or all(source.get("loss") is None for source in _sources(cfg).values()):
        return None
    from composer_dynsample.losses.per_source import PerSourceLoss

    losses = {}
    for name, one in source_configs(cfg).items():
        try:
            losses[name] = build_one(one)
        except ConfigError as error:
            raise ConfigError(f"data.sources.{name}: {error}") from error
    return PerSourceLoss(losses)


def build_mixed_sampler(
    cfg: DictConfig, store: Any, seed: int, build_one: Callable[[DictConfig, Any, int, Any], Any]
) -> Any:
    """The :class:`~composer_dynsample.samplers.mixed.MixedBatchSampler` over each source's own sampler,
    built by ``build_one`` (:func:`~composer_dynsample.config.builders.build_sampler`) from the source's
    config and store; a source's sampler seed is derived from the run's seed and the source's position.
    A source's sampler that draws from the embedding table is fed by the run's one table through the mix
    (each its own source's rows); one that refreshes within an epoch (``refresh_every``) is refused."""
    from composer_dynsample.samplers.mixed import MixedBatchSampler, check_mixable

    samplers = {}
    for position, (name, one) in enumerate(source_configs(cfg).items()):
        own = store.source_stores[position]
        try:
            _check_source_table(one)
            samplers[name] = build_one(one, own.labels, seed + 1000003 * (position + 1), own)
        except ConfigError as error:
            raise ConfigError(f"data.sources.{name}: {error}") from error
        except ValueError as error:  # the sampler's own check of its options against the data
            raise ConfigError(f"data.sources.{name}: sampler: {error}") from error
        try:
            check_mixable(samplers[name])
        except ValueError as error:
            raise ConfigError(f"data.sources.{name}.sampler: {error}") from error
    options = _options(cfg)
    labels = {name: own.labels for name, own in zip(samplers, store.source_stores, strict=True)}
    try:
        return MixedBatchSampler(
            samplers, [len(s) for s in store.source_stores], seed=seed, labels=labels, **options
        )
    except ValueError as error:
        raise ConfigError(f"data: {error}") from error


def check_mix_pools(cfg: DictConfig, world_size: int) -> None:
    """Refuse a pool of embeddings that would hold rows of two sources in one loss: a cross-batch memory
    (``algorithms.hard_negative_mining.memory_size``), and a cross-rank pool (``cross_rank``) unless
    ``data.batches_per_draw`` is a multiple of the number of ranks (every rank's batch of a step then comes
    from one source). A config without a mix passes."""
    if not is_mix(cfg):
        return
    mining = section(
        section(cfg, "algorithms", "algorithms"), "hard_negative_mining", "algorithms.hard_negative_mining"
    )
    if mining.get("memory_size"):
        raise ConfigError(
            "algorithms.hard_negative_mining.memory_size: a cross-batch memory would hold the rows of every source "
            "and mine one source's anchors against another's; a mix of sources does not take one (set it to 0)."
        )
    per_draw = _options(cfg)["batches_per_draw"]
    if mining.get("cross_rank") and world_size > 1 and per_draw % world_size:
        raise ConfigError(
            f"algorithms.hard_negative_mining.cross_rank pools the batches of {world_size} ranks, which come from "
            f"different sources with data.batches_per_draw={per_draw}; set data.batches_per_draw={world_size} "
            "(each step's batches from one source) or cross_rank: false."
        )


def one_source(cfg: DictConfig, source: str | None, what: str) -> DictConfig:
    """The config of one data set for a command that reads one (``what``: ``convert``, ``mine``, ``embed
    --input``): with ``--source NAME``, the mix's source ``NAME`` as ``data`` (and its ``sampler``); without,
    ``cfg`` itself, refused in one line when it is a mix.

    Raises:
        ConfigError: If ``cfg`` is a mix and no source is named, ``source`` is not one of its sources, or a
            source is named for a config that is not a mix.
    """
    if source is None:
        if is_mix(cfg):
            names = ", ".join(_sources(cfg))
            raise ConfigError(
                f"{what} takes one data set, and data is a mix of sources ({names}); name one with --source NAME."
            )
        return cfg
    if not is_mix(cfg):
        raise ConfigError(
            f"--source {source!r}: data is one data set, not a mix of sources; leave --source out."
        )
    configs = source_configs(cfg)
    if source not in configs:
        raise ConfigError(f"--source {source!r}: data.sources holds {', '.join(configs)}; name one of them.")
    return configs[source]
