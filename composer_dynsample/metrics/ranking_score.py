"""One value of :class:`~composer_dynsample.metrics.RankingMetrics` as a scalar metric, for Composer's loggers."""

from __future__ import annotations

from typing import Any

import torch

from composer_dynsample.metrics.ranking import RankingMetrics

__all__ = ["RankingScore"]


class RankingScore(RankingMetrics):
    """A :class:`~composer_dynsample.metrics.RankingMetrics` whose ``compute`` returns one of its values.

    Composer logs each eval metric's ``compute()`` under the metric's name, and loggers such as
    TensorBoard take numbers, not dicts: one ``RankingScore`` per value gives them ``mrr``,
    ``recall_at_1``, ... as scalars. The gallery is set as for ``RankingMetrics`` (``set_gallery``).

    Args:
        value (str): The value returned: ``"mrr"``, ``"csn_mrr"``, ``"mrr@k"``, ``"recall@k"`` or
            ``"ndcg@k"``, its ``k`` among the ``*_ks`` given.
        **options: The options of :class:`~composer_dynsample.metrics.RankingMetrics` (``distance``,
            ``recall_ks``, ``mrr_ks``, ``ndcg_ks``, ``csn_candidates``, ``seed``, ``chunk_size``).

    Raises:
        ValueError: If ``value`` is none of the values the options compute.

    Example:
        >>> metric = RankingScore("recall@1", recall_ks=[1])
        >>> metric.set_gallery(torch.eye(3), torch.arange(3))
        >>> metric.update(torch.tensor([[0.9, 0.1, 0.0], [1.0, 0.0, 0.0]]), torch.tensor([0, 1]))
        >>> float(metric.compute())
        0.5
    """

    def __init__(self, value: str, **options: Any) -> None:
        super().__init__(**options)
        names = self._names()[2:]
        if value not in names:
            raise ValueError(f"value must be one of {names}, got {value!r}.")
        self.value = value

    def compute(self) -> torch.Tensor:  # type: ignore[override]
        """The chosen value, a float64 scalar (NaN when no query has a relevant item)."""
        return super().compute()[self.value]
