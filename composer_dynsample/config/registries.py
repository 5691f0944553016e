"""The short names each config section may use, and how a section is resolved against them.

One registry per section (:data:`DATASETS`, :data:`ENCODERS`, :data:`LOSSES`, :data:`SAMPLERS`,
:data:`ALGORITHMS`, :data:`CALLBACKS`, :data:`OPTIMIZERS`, :data:`SCHEDULERS`, :data:`LOGGERS`) maps a
short name to its target, a :class:`~composer_dynsample.config.registry.Lazy` import path: nothing is
imported until a section names it. The builders of :mod:`composer_dynsample.config.builders` resolve a
section's ``name`` or ``_component_`` here and check its keys before they call the target; the
registries are importable from there too.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from composer_dynsample.config.registry import (
    COMPONENT_KEY,
    ConfigError,
    Lazy,
    Registered,
    check_keys,
    parameters,
    resolve,
)

__all__ = [
    "ALGORITHMS",
    "CALLBACKS",
    "DATASETS",
    "ENCODERS",
    "LOGGERS",
    "LOSSES",
    "OPTIMIZERS",
    "SAMPLERS",
    "SCHEDULERS",
]

_SAMPLER = {"reserved": ("labels", "num_replicas", "rank"), "inferred": ("seed",)}
_STORE_ROWS = ("is_passage", "duplicate_ids")  # what a sampler of pairs reads off the text store


def _from(module: str, pairs: str) -> dict[str, Lazy]:
    """Registry entries of one module from ``"short_name=Attribute ..."`` pairs."""
    return {name: Lazy(module, attribute) for name, attribute in (pair.split("=") for pair in pairs.split())}


# Registry targets are imported on first use (Lazy): checking a config imports only what its sections name.
DATASETS: dict[str, Registered | Lazy] = {
    **_from("composer_dynsample.data", "mnist1d=load_mnist1d digits=load_digits file=load_file"),
    "glyphs": Lazy("composer_dynsample.data.glyphs", "load_glyphs"),
    "pairs": Lazy("composer_dynsample.data.text.pairs", "load_pairs"),
    "texts": Lazy("composer_dynsample.data.text.texts", "load_texts"),
    "code_search": Lazy("composer_dynsample.data.text.code_search_pairs", "load_code_search"),
}
_ENCODERS, _TEXT = "composer_dynsample.models.encoders", "composer_dynsample.models.text"
_TRANSFORMER = "composer_dynsample.models.transformer"
ENCODERS: dict[str, Registered | Lazy] = {
    "conv1d": Lazy(_ENCODERS, "Conv1dEncoder", inferred=("input_length", "in_channels")),
    "mlp": Lazy(_ENCODERS, "MLPEncoder", inferred=("in_features",)),
    "conv2d": Lazy(_ENCODERS, "Conv2dEncoder", inferred=("input_size", "in_channels")),
    "transformer": Lazy(_TRANSFORMER, "TransformerEncoder", inferred=("vocab_size",)),
    "bag_of_tokens": Lazy(_TEXT, "BagOfTokensEncoder", inferred=("vocab_size",)),
    "text_cnn": Lazy(_TEXT, "TextCNNEncoder", inferred=("vocab_size",)),
    # Its towers are model.encoder sections of their own, which the builder builds first.
    "two_tower": Lazy(_TEXT, "TwoTowerEncoder"),
}
LOSSES: dict[str, Registered | Lazy] = _from(
    "composer_dynsample.losses",
    "triplet_margin=TripletMarginLoss contrastive=ContrastiveLoss multi_similarity=MultiSimilarityLoss info_nce=InfoNCELoss",
)
SAMPLERS: dict[str, Registered | Lazy] = {
    "pk": Lazy("composer_dynsample.samplers", "PKBatchSampler", **_SAMPLER),
    "two_stream": Lazy(
        "composer_dynsample.samplers",
        "TwoStreamBatchSampler",
        reserved=("primary_indices", "secondary_indices", "num_replicas", "rank"),
        inferred=("seed",),
        # The primary stream is a stratified `primary_fraction` of the train split, the secondary the rest.
        extra={"primary_fraction": 0.5},
    ),
    "hard_class_pk": Lazy("composer_dynsample.samplers.hard_class", "HardClassPKBatchSampler", **_SAMPLER),
    "neighbours": Lazy("composer_dynsample.samplers.neighbours", "NeighbourBatchSampler", **_SAMPLER),
    # Pairs data only: which rows are passages and the texts' ids come from the store.
    "mined_negatives": Lazy(
        "composer_dynsample.samplers.mined_negatives",
        "MinedNegativesPKBatchSampler",
        reserved=(*_SAMPLER["reserved"], *_STORE_ROWS),
        inferred=("seed",),
    ),
}
ALGORITHMS: dict[str, Registered | Lazy] = {
    **_from(
        "composer_dynsample.algorithms",
        "hard_negative_mining=HardNegativeMining embedding_table=EmbeddingTable",
    ),
    "batch_augmentation": Lazy("composer_dynsample.algorithms.augmentation", "BatchAugmentation"),
}
CALLBACKS: dict[str, Registered | Lazy] = {
    "set_sampler_epoch": Lazy("composer_dynsample.callbacks.set_sampler_epoch", "SetSamplerEpoch"),
    **_from(
        "composer.callbacks",
        "lr_monitor=LRMonitor speed_monitor=SpeedMonitor optimizer_monitor=OptimizerMonitor",
    ),
}
OPTIMIZERS: dict[str, Registered | Lazy] = {
    name: Lazy("torch.optim", attribute, reserved=("params",))
    for name, attribute in (("adamw", "AdamW"), ("adam", "Adam"), ("sgd", "SGD"))
}
SCHEDULERS: dict[str, Registered | Lazy] = {
    "one_cycle": Lazy("composer_dynsample.schedulers", "OneCycleScheduler"),
    **_from(
        "composer.optim",
        "cosine_with_warmup=CosineAnnealingWithWarmupScheduler linear_with_warmup=LinearWithWarmupScheduler "
        "constant_with_warmup=ConstantWithWarmupScheduler",
    ),
}
LOGGERS: dict[str, Registered | Lazy] = _from(
    "composer.loggers",
    "file=FileLogger in_memory=InMemoryLogger tensorboard=TensorboardLogger wandb=WandBLogger mlflow=MLFlowLogger",
)
# What the builder supplies to any sampler, optimizer or data loader target: never a config key.
SAMPLER_RESERVED = ("labels", "num_replicas", "rank")
LOADER_OWNED = ("dataset", "batch_sampler", "batch_size", "shuffle", "sampler", "drop_last", "collate_fn")
MODEL_OWNED = ("encoder", "loss", "train_metrics", "eval_metrics")


def resolve_entry(
    path: str,
    values: dict[str, Any],
    registry: Mapping[str, Any],
    *,
    reserved: tuple[str, ...] = (),
    supplied: Mapping[str, Any] | None = None,
    **kwargs: Any,
) -> tuple[Registered, str, dict[str, Any], dict[str, Any]]:
    """Resolve a section's target and check its keys: ``(entry, name, kwargs, builder-level extras)``.

    ``supplied`` holds values the builder fills in for the arguments of those names that the target takes
    and the section leaves out (an encoder's input sizes).
    """
    entry, name = resolve(path, values, registry, **kwargs)
    if reserved and not entry.reserved:  # a _component_: the builder's own arguments are not keys
        entry = Registered(entry.target, reserved=reserved, inferred=("seed",))
    takes = parameters(entry.target)
    for key, value in (supplied or {}).items():
        if key in takes:
            values.setdefault(key, value)
    if not entry.accepts_any_key():
        check_keys(path, values, entry.valid_keys(), repr(name))
    missing = [arg for arg in entry.required_keys() if arg not in values]
    if missing:
        raise ConfigError(f"{path}: {name!r} needs the key {missing[0]!r}; valid keys: {entry.valid_keys()}.")
    extras = {key: values[key] for key in entry.extra if key in values}
    return entry, name, {key: value for key, value in values.items() if key not in entry.extra}, extras


def peek_entry(path: str, values: dict[str, Any], registry: Mapping[str, Any]) -> Any:
    """The target a section names, without consuming its keys (for choices that depend on the target)."""
    return resolve(path, dict(values), registry)[0].target


#: The algorithm that hands a model-aware sampler its snapshot of the model at every epoch start.
_TABLE = "embedding_table"


def check_sampler_table(sampler: Mapping[str, Any], algorithms: Mapping[str, Any]) -> None:
    """Refuse a model-aware sampler that no ``algorithms.embedding_table`` feeds.

    ``mined_negatives``, ``neighbours`` and ``hard_class_pk`` (with a ``hard_fraction`` above 0) build
    their batches from the snapshot :class:`~composer_dynsample.EmbeddingTable` hands them at every epoch
    start; without one they train on random negatives or classes and say nothing. A table with
    ``feed_sampler: false`` is taken as meant (a control run of random negatives), and so is any
    algorithm given by a ``_component_`` of the user's, which may feed the sampler itself.

    Args:
        sampler (Mapping[str, Any]): The ``sampler`` section.
        algorithms (Mapping[str, Any]): The ``algorithms`` section.

    Raises:
        ConfigError: If the sampler takes a snapshot and no algorithm may hand it one.
    """
    if not sampler:
        return
    target = peek_entry("sampler", dict(sampler), SAMPLERS)
    without = _without_table(target)
    only_classes = not hasattr(target, "update_neighbours")
    if without is None or (only_classes and sampler.get("hard_fraction") == 0):
        return  # hard_fraction 0: the hard-class sampler is P x K on purpose
    if any(_may_feed(label, keys) for label, keys in algorithms.items()):
        return
    name = sampler.get(COMPONENT_KEY, sampler.get("name"))
    raise ConfigError(
        f"sampler: {name!r} takes its batches from the embedding table's snapshot of the model, but the "
        f"algorithms section has no {_TABLE}, so {without}. Add algorithms: {{{_TABLE}: {{}}}} (on the "
        f"command line: 'algorithms.{_TABLE}={{}}'); for random ones on purpose, add it with feed_sampler: false."
    )


def _without_table(target: Any) -> str | None:
    """What a sampler would do without the table's snapshot, or ``None`` for a sampler that takes none."""
    if hasattr(target, "update_neighbours"):  # nearest rows: a pairs sampler's are passages
        if "is_passage" in parameters(target):
            return "every negative would be a random passage"
        return "every negative would be a random sample of another class"
    if hasattr(target, "update_class_embeddings"):
        return "every batch would hold random classes, as sampler.name: pk does"
    return None


def _may_feed(label: str, keys: Any) -> bool:
    """Whether an ``algorithms`` entry is an embedding table, or an algorithm of the user's that may feed the sampler."""
    if not isinstance(keys, Mapping):
        return keys is not None  # null is off; any other value is refused by the algorithms' builder
    component = keys.get(COMPONENT_KEY, label)  # a dotted path of the user's: it may feed the sampler
    return not isinstance(component, str) or component not in ALGORITHMS or component == _TABLE
