"""The checks and warnings of :class:`~composer_dynsample.HardNegativeMining`, as functions of their own.

:func:`check_strategy` and :func:`parse_schedule` validate what the algorithm is built with;
:func:`check_embeddings_and_labels` and :func:`check_duplicate_ids` what it reads from ``State`` (found
there by :func:`~composer_dynsample.algorithms._batch.find_in_batch`); :class:`NothingMinedWatch` watches
what it finds while training.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Collection, Mapping

import torch
from composer.core import Time, TimeUnit

from composer_dynsample.validation import check_labels, did_you_mean, parse_time

__all__ = [
    "NOTHING_MINED_PATIENCE",
    "NothingMinedWatch",
    "check_duplicate_ids",
    "check_embeddings_and_labels",
    "check_strategy",
    "parse_schedule",
]

log = logging.getLogger(__name__)

#: Consecutive mining steps without a tuple (or a whole epoch of them, if shorter) before the warning.
NOTHING_MINED_PATIENCE = 20


def check_strategy(name: object, strategies: Collection[str], where: str = "strategy") -> str:
    """Return ``name`` if it is one of ``strategies``, else raise a ``ValueError`` with the closest name.

    Example:
        >>> check_strategy("semihard", ["batch_hard", "semi_hard"])
        Traceback (most recent call last):
            ...
        ValueError: strategy must be one of ['batch_hard', 'semi_hard'], got 'semihard'. Did you mean 'semi_hard'?
    """
    if not isinstance(name, str) or name not in strategies:
        raise ValueError(
            f"{where} must be one of {sorted(strategies)}, got {name!r}.{did_you_mean(name, strategies)}"
        )
    return name


def parse_schedule(strategy: str | Mapping[str, str], strategies: Collection[str]) -> list[tuple[Time, str]]:
    """A strategy name or a ``{time string: name}`` schedule as ``[(start, name), ...]`` sorted by start.

    The schedule must start at zero and use one time unit. Every name must be one of ``strategies``.

    Example:
        >>> schedule = parse_schedule({"40ep": "batch_hard", "0ep": "semi_hard"}, ["batch_hard", "semi_hard"])
        >>> [(str(start), name) for start, name in schedule]
        [('0ep', 'semi_hard'), ('40ep', 'batch_hard')]
    """
    if isinstance(strategy, str):
        entries = [(Time(0, TimeUnit.BATCH), check_strategy(strategy, strategies))]
    elif isinstance(strategy, Mapping) and strategy:
        entries = [
            (parse_time("strategy schedule key", key), check_strategy(name, strategies, f"strategy[{key!r}]"))
            for key, name in strategy.items()
        ]
    else:
        raise ValueError(
            f"strategy must be a strategy name or a non-empty mapping of time strings to names, got {strategy!r}."
        )
    if len({start.unit for start, _ in entries}) > 1:
        raise ValueError(
            f"a strategy schedule must use one time unit for all its keys, got {list(dict(strategy))}."
        )
    entries.sort(key=lambda entry: int(entry[0].value))
    if int(entries[0][0].value) != 0:
        raise ValueError(
            f"a strategy schedule must say what runs from the start (a key like '0ep'), got {list(dict(strategy))}."
        )
    return entries


class NothingMinedWatch:
    """Warn once (a ``UserWarning`` and a log line) when consecutive mining steps find no tuple at all.

    Such steps give a zero loss and train nothing. ``patience`` consecutive empty steps, or a whole epoch
    of them when an epoch is shorter, trigger the warning, which names the likely cause read off the
    last batch's labels: no label twice (``samples_per_class=1``), one label only, or a strategy that
    selects nothing among the pairs there are.

    Args:
        patience (int): Consecutive empty steps before the warning. Default: :data:`NOTHING_MINED_PATIENCE`.

    Example:
        >>> watch = NothingMinedWatch(patience=2)
        >>> labels = torch.arange(4)
        >>> watch.update(0, labels, None, strategy="semi_hard", batch=1)
        >>> import warnings
        >>> with warnings.catch_warnings(record=True) as caught:
        ...     warnings.simplefilter("always")
        ...     watch.update(0, labels, None, strategy="semi_hard", batch=2)
        >>> "No label occurs twice" in str(caught[0].message)
        True
    """

    def __init__(self, patience: int = NOTHING_MINED_PATIENCE) -> None:
        self.patience = patience
        self.empty_steps = 0
        self.warned = False

    def update(
        self,
        num_tuples: float,
        labels: torch.Tensor,
        pool_labels: torch.Tensor | None,
        *,
        strategy: str,
        batch: int,
        steps_per_epoch: int | None = None,
    ) -> None:
        """Count one mining step; warn when the empty steps in a row reach the patience.

        Args:
            num_tuples (float): The tuples the step found.
            labels (torch.Tensor): The step's anchor labels.
            pool_labels (torch.Tensor, optional): The labels of the pool it mined against, when not the batch.
            strategy (str): The strategy that ran.
            batch (int): The batch being trained, counted from 1, for the message.
            steps_per_epoch (int, optional): The batches in an epoch, when known.
        """
        if num_tuples > 0:
            self.empty_steps = 0
            return
        self.empty_steps += 1
        limit = min(self.patience, steps_per_epoch) if steps_per_epoch else self.patience
        if self.warned or self.empty_steps < max(limit, 1):
            return
        self.warned = True
        message = (
            f"HardNegativeMining: {strategy} found no tuple in {self.empty_steps} consecutive steps (through "
            f"batch {batch}): the loss is zero and nothing trains. {_likely_cause(labels, pool_labels, strategy)}"
        )
        log.warning(message)
        warnings.warn(message, UserWarning, stacklevel=3)


def _likely_cause(labels: torch.Tensor, pool_labels: torch.Tensor | None, strategy: str) -> str:
    """The likely reason a step found nothing, read off its labels (the pool's when it has one)."""
    pool = labels if pool_labels is None else pool_labels
    _, counts = torch.unique(pool, return_counts=True)
    rows = "the pool" if pool_labels is not None else f"the batch of {labels.numel()} rows"
    if counts.numel() and int(counts.max()) < 2:
        return (
            f"No label occurs twice in {rows}, so there is no positive pair: use a P x K sampler with "
            "samples_per_class >= 2 (samples_per_class=1, or a sampler that does not group classes, "
            "does this)."
        )
    if counts.numel() == 1:
        return (
            f"Every row of {rows} has the same label, so there is no negative: batches must hold "
            "several classes (a P x K sampler with classes_per_batch >= 2)."
        )
    return (
        f"{rows[0].upper() + rows[1:]} holds positive and negative pairs but {strategy} selected none: its "
        "margin or epsilon may be met everywhere (for semi_hard with fallback='none', the negatives all "
        "lie beyond the margin); a larger margin or another strategy (batch_hard) keeps training."
    )


def check_embeddings_and_labels(embeddings: torch.Tensor, labels: torch.Tensor) -> None:
    """Raise a ``ValueError`` unless the embeddings are ``(B, D)`` floats and the labels ``B`` integers."""
    if embeddings.ndim != 2 or not embeddings.is_floating_point():
        raise ValueError(
            f"HardNegativeMining needs (batch, dim) float embeddings, got shape {tuple(embeddings.shape)} and dtype {embeddings.dtype}."
        )
    check_labels("labels", labels, embeddings.shape[0], "embeddings")


def check_duplicate_ids(ids: torch.Tensor, labels: torch.Tensor, key: str | int) -> torch.Tensor:
    """Return the batch's duplicate ids if they are a 1-D integer tensor of the labels' length."""
    return check_labels(
        f"the duplicate id tensor at state.batch[{key!r}] (duplicate_key)", ids, labels.shape[0], "labels"
    )
