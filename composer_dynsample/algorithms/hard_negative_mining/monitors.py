"""The warnings :class:`~composer_dynsample.HardNegativeMining` raises while training, from the steps' statistics.

:class:`NothingMinedWatch` warns when mining steps keep finding no tuple (the loss is zero and nothing
trains), :class:`CollapseWatch` when the embeddings' spread falls to nothing. The checks of what the
algorithm is built with and reads are in :mod:`.checks`.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Mapping

import torch

__all__ = ["NOTHING_MINED_PATIENCE", "CollapseWatch", "NothingMinedWatch"]

log = logging.getLogger(__name__)

#: Consecutive mining steps without a tuple (or a whole epoch of them, if shorter) before the warning.
NOTHING_MINED_PATIENCE = 20


class NothingMinedWatch:
    """Warn once (a ``UserWarning`` and a log line) when consecutive mining steps find no tuple at all.

    Such steps give a zero loss and train nothing. ``patience`` consecutive empty steps, or a whole epoch
    of them when an epoch is shorter, trigger the warning, which names the likely cause read off the
    last batch's labels: no label twice (``samples_per_class=1``), one label only, or a strategy that
    selects nothing among the pairs there are. The run of empty steps is counted on the device
    (:class:`~composer_dynsample.algorithms.hard_negative_mining.log_window.LogWindow`) and checked here
    when the algorithm logs.

    Args:
        patience (int): Consecutive empty steps before the warning. Default: :data:`NOTHING_MINED_PATIENCE`.

    Example:
        >>> watch = NothingMinedWatch(patience=2)
        >>> labels = torch.arange(4)
        >>> watch.update(1, labels, None, strategy="semi_hard", batch=1)
        >>> import warnings
        >>> with warnings.catch_warnings(record=True) as caught:
        ...     warnings.simplefilter("always")
        ...     watch.update(2, labels, None, strategy="semi_hard", batch=2)
        >>> "No label occurs twice" in str(caught[0].message)
        True
    """

    def __init__(self, patience: int = NOTHING_MINED_PATIENCE) -> None:
        self.patience = patience
        self.warned = False

    def update(
        self,
        empty_steps: int,
        labels: torch.Tensor,
        pool_labels: torch.Tensor | None,
        *,
        strategy: str,
        batch: int,
        steps_per_epoch: int | None = None,
        device_rows: int | None = None,
    ) -> None:
        """Warn when the run of empty steps reaches the patience.

        Args:
            empty_steps (int): The longest run of consecutive steps without a tuple, up to ``batch``.
            labels (torch.Tensor): The last step's anchor labels.
            pool_labels (torch.Tensor, optional): The labels of the pool it mined against, when not the batch.
            strategy (str): The strategy that ran.
            batch (int): The batch being trained, counted from 1, for the message.
            steps_per_epoch (int, optional): The batches in an epoch, when known.
            device_rows (int, optional): The rows of the device batch, when Composer split it into
                microbatches of fewer rows (the step mined one microbatch).
        """
        limit = min(self.patience, steps_per_epoch) if steps_per_epoch else self.patience
        if self.warned or empty_steps < max(limit, 1):
            return
        self.warned = True
        message = (
            f"HardNegativeMining: {strategy} found no tuple in {empty_steps} consecutive steps (through "
            f"batch {batch}): the loss is zero and nothing trains. "
            f"{_likely_cause(labels, pool_labels, strategy, device_rows)}"
        )
        log.warning(message)
        warnings.warn(message, UserWarning, stacklevel=3)


def _likely_cause(
    labels: torch.Tensor, pool_labels: torch.Tensor | None, strategy: str, device_rows: int | None = None
) -> str:
    """The likely reason a step found nothing, read off its labels (the pool's when it has one)."""
    pool = labels if pool_labels is None else pool_labels
    _, counts = torch.unique(pool, return_counts=True)
    rows = "the pool" if pool_labels is not None else f"the batch of {labels.numel()} rows"
    if (
        pool_labels is None
        and device_rows is not None
        and labels.numel() < device_rows
        and counts.numel() == 1
    ):
        return (
            f"Composer splits each batch of {device_rows} rows into microbatches of {labels.numel()} "
            "(device_train_microbatch_size), each of one class, so no microbatch has a negative: set "
            f"device_train_microbatch_size to {device_rows}, or use EmbeddingModel(forward_chunk_size=N) for memory."
        )
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

    def update(
        self,
        stats: Mapping[str, float],
        *,
        batch: int,
        memory_active: bool = False,
        smallest: float | None = None,
    ) -> None:
        """Read the ``embedding_spread`` (steps without it are skipped) and warn on a new fall.

        Args:
            stats (Mapping[str, float]): The statistics, with the last step's ``embedding_spread``.
            batch (int): The batch, for the message.
            memory_active (bool): Whether a cross-batch memory was mined against, for the message.
            smallest (float, optional): The smallest spread since the last update, when several steps passed.
        """
        spread = stats.get("embedding_spread")
        if spread is None:
            return
        low = spread if smallest is None else min(spread, smallest)
        if self.warned and spread >= 10 * self.threshold:
            self.warned = False  # recovered: a later fall warns again
        if self.warned or low >= self.threshold:
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
            f"{low:.2e} < {self.threshold:g} at batch {batch}). Batch-hard "
            "mining from the first step often does this; start with semi_hard and switch later, e.g. "
            "strategy={'0ep': 'semi_hard', '40ep': 'batch_hard'}, or lower the learning rate." + memory,
            UserWarning,
            stacklevel=3,
        )
