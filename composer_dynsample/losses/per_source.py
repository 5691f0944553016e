"""A loss per source of a mix of data sets: each batch scored by the loss of the source it comes from.

A run on several data sets (``data: {name: mix}``) draws every batch from one source, and the collate
names it (the batch's ``"source"``, a string: broadcast to every microbatch, never moved to the device, so
choosing the loss reads nothing back from it). ``data.sources.NAME.loss`` gives a source its own
``model.loss`` section (P x K labelled texts a margin loss, retrieval pairs InfoNCE); the sources without
one take the run's ``model.loss``. The keyword arguments the model hands a loss (``global_mean``,
``duplicate_ids``, ``is_query``) reach a source's loss when its ``forward`` takes them.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn

from composer_dynsample.losses.wrapper import LossCall, LossWrapper

__all__ = ["PerSourceLoss"]


class PerSourceLoss(LossWrapper):
    """The loss of each source by name; ``forward`` scores a batch with its source's loss.

    Args:
        losses (Mapping[str, nn.Module]): Each source's loss, by source name.

    Raises:
        ValueError: If ``losses`` is empty.

    Example:
        >>> from composer_dynsample import InfoNCELoss, TripletMarginLoss
        >>> loss = PerSourceLoss({"qa": InfoNCELoss(), "intents": TripletMarginLoss(margin=0.2)})
        >>> embeddings, labels = torch.nn.functional.normalize(torch.randn(4, 8), dim=1), torch.tensor([0, 0, 1, 1])
        >>> bool(loss(embeddings, labels, source="qa") == InfoNCELoss()(embeddings, labels))
        True
    """

    def __init__(self, losses: Mapping[str, nn.Module]) -> None:
        super().__init__()
        if not losses:
            raise ValueError("losses must name at least one source's loss.")
        self.losses = nn.ModuleDict(dict(losses))

    @property
    def negatives(self) -> str | None:
        """``"passages"`` when a source's loss ranks queries against passages only (the model then hands over
        which rows are queries), else ``None``."""
        kinds = {getattr(loss, "negatives", None) for loss in self.losses.values()}
        return "passages" if "passages" in kinds else None

    def wrapped(self, call: LossCall) -> torch.Tensor:
        """The loss of the batch's source's loss (``keywords["source"]``, the batch's ``"source"``)."""
        source = call.keywords["source"]
        if source is None or source not in self.losses:
            raise ValueError(
                f"PerSourceLoss scores a batch by its source's loss and got source={source!r}; the batches of "
                f"data: {{name: mix}} name one of {sorted(self.losses)} (each batch from one source)."
            )
        loss = self.losses[source]
        queries = call.keywords["is_query"] if getattr(loss, "negatives", None) == "passages" else None
        return call.to(loss, keywords={**call.keywords, "source": None, "is_query": queries})
