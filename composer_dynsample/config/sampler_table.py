"""The one check that joins two sections: a model-aware sampler needs an ``algorithms.embedding_table``.

:func:`check_sampler_table` runs for the run's own ``sampler`` and ``algorithms`` sections
(:mod:`.checks`) and for each source of a mix (:mod:`.mix_data`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from composer_dynsample.config.components import COMPONENT_KEY, ConfigError, parameters, peek_entry
from composer_dynsample.config.names import ALGORITHMS, SAMPLERS

__all__ = ["check_sampler_table"]


#: The algorithm that hands a model-aware sampler its snapshot of the model at every epoch start.
_TABLE = "embedding_table"


def check_sampler_table(sampler: Mapping[str, Any], algorithms: Mapping[str, Any]) -> None:
    """Refuse a model-aware sampler that no ``algorithms.embedding_table`` feeds.

    ``mined_negatives``, ``neighbours`` and ``hard_class_pk`` (with a ``hard_fraction`` above 0) build
    their batches from the snapshot :class:`~composer_dynsample.EmbeddingTable` hands them at every epoch
    start; without one they train on random negatives or classes and say nothing. A table with
    ``feed_sampler: false`` is taken as meant (a control run of random negatives), and so is any
    algorithm given by a ``_component_`` of the user's, which may feed the sampler itself. The refusal
    advises a table with ``warm_start: true``, whose first snapshot is taken before the first step:
    without it the first epoch's negatives (or classes) are random, and a run shorter than an epoch is
    random throughout.

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
    chosen = "negatives" if hasattr(target, "update_neighbours") else "classes"
    raise ConfigError(
        f"sampler: {name!r} takes its batches from the embedding table's snapshot of the model, but the "
        f"algorithms section has no {_TABLE}, so {without}. Add algorithms: {{{_TABLE}: {{warm_start: true}}}} "
        f"(on the command line: 'algorithms.{_TABLE}={{warm_start: true}}'): {chosen} mined from the first "
        f"step (without warm_start the first epoch's {chosen} are random); for random ones on purpose, add "
        "it with feed_sampler: false."
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
