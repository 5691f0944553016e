"""The checks and warnings of :class:`~composer_dynsample.HardNegativeMining`, as functions of their own.

:func:`check_pool_options`, :func:`check_batch_key` and :func:`build_scheduled_miners` validate what the
algorithm is built with; :func:`check_embeddings_and_labels` and :func:`check_duplicate_ids` what it reads
from ``State`` (found there by :func:`~composer_dynsample.batches.find_in_batch`).
:class:`NothingMinedWatch` and :class:`CollapseWatch` watch the statistics of the steps while training,
and :func:`microbatch_warning` and :func:`nonfinite_message` say what went wrong in words.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Iterable, Mapping
from typing import Any

import torch

from composer_dynsample.algorithms.hard_negative_mining.schedule import parse_schedule
from composer_dynsample.batches import find_in_batch
from composer_dynsample.mined import MinedBatch
from composer_dynsample.mining.base import BaseMiner
from composer_dynsample.mining.registry import MINERS, build_miner, check_strategy
from composer_dynsample.validation import check_bool, check_labels

__all__ = [
    "GATHERS",
    "NOTHING_MINED_PATIENCE",
    "CollapseWatch",
    "NothingMinedWatch",
    "build_scheduled_miners",
    "check_batch_key",
    "check_duplicate_ids",
    "check_embeddings_and_labels",
    "check_pool_options",
    "check_strategy",
    "microbatch_warning",
    "nonfinite_message",
    "parse_schedule",
    "read_step_tensors",
]

#: The values of ``gather`` with ``cross_rank=True``.
GATHERS = ("autograd", "constant")

log = logging.getLogger(__name__)

#: Consecutive mining steps without a tuple (or a whole epoch of them, if shorter) before the warning.
NOTHING_MINED_PATIENCE = 20


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

    def update_from(self, mined: MinedBatch, *, batch: int, steps_per_epoch: object = None) -> None:
        """:meth:`update` with a step's :class:`~composer_dynsample.MinedBatch` (a skipped step, which
        mined nothing on purpose, does not count); ``steps_per_epoch`` may be a Composer ``Time``."""
        if "num_tuples" in mined.stats:
            steps = None if steps_per_epoch is None else int(steps_per_epoch)  # type: ignore[call-overload]
            self.update(
                mined.stats["num_tuples"],
                mined.labels,
                mined.ref_labels,
                strategy=mined.strategy,
                batch=batch,
                steps_per_epoch=steps,
            )

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


def read_step_tensors(
    state: Any,
    embeddings_key: str | int | None,
    labels_key: str | int | None,
    duplicate_key: str | int | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """The step's embeddings (from ``state.outputs``), labels and duplicate ids (from ``state.batch``; ids
    only with a ``duplicate_key``), checked; a missing one raises an error naming the option to set."""

    def find(source: Any, key: str | int | None, what: str, option: str, **defaults: Any) -> torch.Tensor:
        advice = f"Set {option} to where it is."
        return find_in_batch(source, key, owner="HardNegativeMining", what=what, advice=advice, **defaults)

    embeddings = find(
        state.outputs, embeddings_key, "the embeddings", "embeddings_key", where="state.outputs"
    )
    labels = find(state, labels_key, "the labels", "labels_key", dict_key="labels", index=1)
    check_embeddings_and_labels(embeddings, labels)
    if duplicate_key is None:
        return embeddings, labels, None
    ids = find(state, duplicate_key, "the duplicate ids", "duplicate_key")
    return embeddings, labels, check_duplicate_ids(ids, labels, duplicate_key)


def check_duplicate_ids(ids: torch.Tensor, labels: torch.Tensor, key: str | int) -> torch.Tensor:
    """Return the batch's duplicate ids if they are a 1-D integer tensor of the labels' length."""
    return check_labels(
        f"the duplicate id tensor at state.batch[{key!r}] (duplicate_key)", ids, labels.shape[0], "labels"
    )


def build_scheduled_miners(
    names: Iterable[str], miner_kwargs: Mapping[str, Mapping[str, Any]] | None, distance: str
) -> dict[str, BaseMiner]:
    """Build the miner of every scheduled strategy and of every ``miner_kwargs`` key, checked now.

    A strategy scheduled from a later epoch would otherwise fail only there, after hours of training.

    Example:
        >>> build_scheduled_miners(["semi_hard"], {"hard_topk": {"k": 3}}, "cosine")["hard_topk"]
        HardTopKMiner(k=3, distance='cosine', chunk_size=None)
    """
    kwargs = dict(miner_kwargs or {})
    for name in kwargs:
        check_strategy(name, MINERS, "a miner_kwargs key")
    return {
        name: build_miner(name, kwargs.get(name), distance=distance, where=f"miner_kwargs[{name!r}]")
        for name in dict.fromkeys([*names, *kwargs])
    }


def check_pool_options(cross_rank: object, gather: object) -> tuple[bool, str | None]:
    """``(cross_rank, gather)`` checked: ``gather`` must be explicit with ``cross_rank`` and absent without."""
    cross_rank = check_bool("cross_rank", cross_rank)
    if cross_rank and gather not in GATHERS:
        raise ValueError(
            f"cross_rank=True needs an explicit gather: 'autograd' (gradients flow to every rank) or "
            f"'constant' (other ranks' embeddings as constants), got {gather!r}."
        )
    if not cross_rank and gather is not None:
        raise ValueError(f"gather={gather!r} only applies with cross_rank=True.")
    return cross_rank, gather  # type: ignore[return-value]


def check_batch_key(name: str, key: object) -> str | int | None:
    """``key`` if it is a batch key (a string or an index) or ``None``."""
    if key is not None and (isinstance(key, bool) or not isinstance(key, (str, int))):
        raise ValueError(f"{name} must be a batch key (a string or an index) or None, got {key!r}.")
    return key  # type: ignore[return-value]


def nonfinite_message(batch: int) -> str:
    """The error for NaN or inf embeddings at ``batch`` with ``on_nonfinite='raise'``."""
    return (
        f"HardNegativeMining: the embeddings at batch {batch} contain NaN or inf (on this or another rank). "
        "Lower the learning rate, check the inputs, or pass on_nonfinite='skip' to skip such steps."
    )


def microbatch_warning(rows: int, device_rows: int | None, forward_chunk_size: int | None) -> str | None:
    """The warning when Composer split the device batch of ``device_rows`` into microbatches of ``rows``,
    so that mining sees a microbatch, not the batch; ``None`` when it did not.

    Example:
        >>> microbatch_warning(32, 32, None) is None, microbatch_warning(16, 32, None)[:42]
        (True, 'HardNegativeMining: Composer split the dev')
    """
    if device_rows is None or rows >= device_rows:
        return None
    advice = (
        f"forward_chunk_size={forward_chunk_size} already bounds the activation memory: set "
        f"device_train_microbatch_size to the device batch ({device_rows})"
        if forward_chunk_size
        else "EmbeddingModel(forward_chunk_size=N) with device_train_microbatch_size at the device batch "
        "gives mining the whole batch at one chunk's activation memory"
    )
    return (
        f"HardNegativeMining: Composer split the device batch of {device_rows} rows into "
        f"microbatches of {rows} (device_train_microbatch_size), so mining, the cross-batch memory and "
        f"the loss see one microbatch at a time. {advice}."
    )


class CollapseWatch:
    """Warn when the embeddings' spread (mean pairwise distance) falls below ``threshold``: once per fall.

    A network whose first outputs are nearly identical (common without normalisation layers) and that
    spreads out still gets a warning if it collapses later: recovery to ten times the threshold re-arms it.

    Args:
        threshold (float): The spread below which the embeddings have collapsed.
        distance (str): The distance the spread is measured in, for the message.

    Example:
        >>> watch = CollapseWatch(1e-3, "cosine")
        >>> import warnings
        >>> with warnings.catch_warnings(record=True) as caught:
        ...     warnings.simplefilter("always")
        ...     for spread in (1e-4, 1e-4, 1.0, 1e-4):
        ...         watch.update({"embedding_spread": spread}, batch=1)
        >>> len(caught)
        2
    """

    def __init__(self, threshold: float, distance: str) -> None:
        self.threshold, self.distance = threshold, distance
        self.warned = False

    def update(self, stats: Mapping[str, float], *, batch: int, memory_active: bool = False) -> None:
        """Read one step's ``embedding_spread`` (steps without it are skipped) and warn on a new fall."""
        spread = stats.get("embedding_spread")
        if spread is None:
            return
        if spread >= 10 * self.threshold:
            self.warned = False
            return
        if self.warned or spread >= self.threshold:
            return
        self.warned = True
        memory = (
            " A cross-batch memory that starts while the embeddings still move fast can do this too: start "
            "it later (memory_start)."
            if memory_active
            else ""
        )
        warnings.warn(
            f"HardNegativeMining: the embeddings have collapsed (mean pairwise {self.distance} distance "
            f"{spread:.2e} < {self.threshold:g} at batch {batch}). Batch-hard "
            "mining from the first step often does this; start with semi_hard and switch later, e.g. "
            "strategy={'0ep': 'semi_hard', '40ep': 'batch_hard'}, or lower the learning rate." + memory,
            UserWarning,
            stacklevel=3,
        )
