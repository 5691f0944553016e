"""How Composer sizes and splits text batches: a ``DataSpec`` for loaders of :class:`TextCollate` batches.

Composer's default cannot size a batch whose ``features`` is a dict, and would cut a batch's given
negatives apart when microbatching. :func:`text_data_spec` counts the sampled rows (:class:`CountSampledRows`),
keeps a batch with given negatives whole (:class:`SplitTextBatch`) and counts unpadded tokens
(:func:`count_tokens`), all without reading the device.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from composer_dynsample.data.text.store import TextCollate

__all__ = ["CountSampledRows", "SplitTextBatch", "count_tokens", "host_sum", "text_data_spec"]


class CountSampledRows:
    """``get_num_samples_in_batch`` for text batches: the rows a sampler drew, given negatives not counted.

    Composer counts a batch in host memory and, inside the step, again on the device, where this reads
    nothing: the batch's length without ``given_negatives`` (every row sampled), else the last host batch's
    count (a batch with given negatives is never split, :class:`SplitTextBatch`); another length is read.

    Args:
        num_sampled (int): ``len(store)``: rows with a smaller index were sampled.
        given_negatives (bool): Whether the split has given negatives. Default: ``True``.
    """

    def __init__(self, num_sampled: int, given_negatives: bool = True) -> None:
        self.num_sampled = int(num_sampled)
        self.given_negatives = bool(given_negatives)
        self._last: tuple[int, int] | None = None  # (rows, sampled rows) of the last host batch

    def __call__(self, batch: dict[str, Any]) -> int:
        index = batch["index"]
        if index.device.type == "cpu":
            count = host_sum(index < self.num_sampled)
            self._last = (int(index.shape[0]), count)
            return count
        if not self.given_negatives:
            return int(index.shape[0])
        if self._last is not None and self._last[0] == index.shape[0]:
            return self._last[1]
        return host_sum(index < self.num_sampled)


class SplitTextBatch:
    """``split_batch`` for text batches: rows split as usual, but a batch with given negatives stays whole.

    The given negatives of a batch belong to all its anchors, so a microbatch cut would take them from
    some; a batch that has them is kept whole when the microbatch holds all its sampled rows, and refused
    otherwise.

    Args:
        num_sampled (int): ``len(store)``.
    """

    def __init__(self, num_sampled: int) -> None:
        self.count = CountSampledRows(num_sampled)

    def __call__(self, batch: dict[str, Any], microbatch_size: int | float) -> Sequence[dict[str, Any]]:
        from composer.core.data_spec import default_split_batch

        sampled = self.count(batch)
        if sampled == len(batch["index"]):
            return default_split_batch(batch, microbatch_size)
        if microbatch_size >= sampled:
            return [batch]
        raise ValueError(
            f"a text batch with given negatives cannot be split into microbatches of {microbatch_size}: "
            f"it has {sampled} sampled rows; set device_train_microbatch_size to the batch size ({sampled})."
        )


def count_tokens(batch: dict[str, Any]) -> int:
    """``get_num_tokens_in_batch`` for text batches: the unpadded tokens."""
    return host_sum(batch["features"]["attention_mask"])


def host_sum(values: torch.Tensor) -> int:
    """The sum of a batch's tensor as an int: in host memory through numpy (no device read), else one read.

    Example:
        >>> host_sum(torch.tensor([[1, 1, 0], [1, 0, 0]]))
        3
    """
    return int(values.numpy().sum()) if values.device.type == "cpu" else int(values.sum())


def text_data_spec(dataloader: Any) -> Any:
    """A Composer ``DataSpec`` for a loader whose collate is a :class:`TextCollate`.

    Composer's default cannot size a batch whose ``features`` is a dict ("Unable to determine the batch
    size"), and would cut its given negatives apart when microbatching; this one counts the sampled rows
    (:class:`CountSampledRows`), keeps a batch with given negatives whole (:class:`SplitTextBatch`) and
    counts unpadded tokens.

    Args:
        dataloader (torch.utils.data.DataLoader): The loader, ``collate_fn`` a :class:`TextCollate`.

    Returns:
        composer.core.DataSpec: Pass it as ``train_dataloader`` (or an ``Evaluator``'s ``dataloader``).
    """
    from composer.core import DataSpec

    collate = getattr(dataloader, "collate_fn", None)
    if not isinstance(collate, TextCollate):
        raise TypeError(
            f"text_data_spec needs a DataLoader whose collate_fn is a TextCollate, got {type(collate).__name__}."
        )
    num_sampled = len(collate.store)
    given = bool(len(collate.store.negative_rows)) and collate.negatives
    return DataSpec(
        dataloader,
        split_batch=SplitTextBatch(num_sampled),
        get_num_samples_in_batch=CountSampledRows(num_sampled, given_negatives=given),
        get_num_tokens_in_batch=count_tokens,
    )
