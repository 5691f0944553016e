"""``MinedBatch``: the contract between the mining algorithm and the loss.

:class:`~composer_dynsample.algorithms.HardNegativeMining` replaces ``state.outputs`` at
``Event.AFTER_FORWARD`` with a :class:`MinedBatch`, so the model's ``loss(outputs, batch)`` receives the
embeddings of the forward pass together with the tuples mined on them. A user's own ``ComposerModel``
consumes it in its ``loss`` as::

    def loss(self, outputs, batch):
        if isinstance(outputs, MinedBatch):
            return my_loss(outputs.embeddings, outputs.labels, outputs.indices_tuple,
                           outputs.ref_embeddings, outputs.ref_labels)
        ...

which is exactly the call signature of pytorch-metric-learning losses (``indices_tuple``, ``ref_emb``,
``ref_labels``), so those work unchanged, and of the losses in :mod:`composer_dynsample.losses`;
:func:`~composer_dynsample.mined_loss` (``mined_loss(my_loss, outputs)``) writes that call, and adds the
keywords a loss of this package takes. A loss given the :class:`MinedBatch` itself where the embeddings
belong is refused in one line naming that call, and a loss that never reads ``indices_tuple`` is warned
about once (it trains on every tuple of the batch).
With duplicate ids (``HardNegativeMining(duplicate_key=...)``), a loss that takes every pool row as a
negative also needs them: :class:`~composer_dynsample.InfoNCELoss` takes ``duplicate_ids=`` and
``ref_duplicate_ids=`` keywords, which ``EmbeddingModel`` passes when the loss accepts them.
``eval_forward`` and train metrics receive the same object: use :attr:`MinedBatch.outputs` for what
the forward pass returned.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

__all__ = ["MinedBatch"]


@dataclass
class MinedBatch:
    """The embeddings of one microbatch and the tuples mined on them.

    Attributes:
        embeddings (torch.Tensor): This rank's ``(B, D)`` embeddings from the forward pass, with their graph.
        labels (torch.Tensor): This rank's ``(B,)`` labels.
        indices_tuple (tuple[torch.Tensor, ...]): Triplets ``(anchors, positives, negatives)`` or pairs
            ``(a1, p, a2, n)`` in pytorch-metric-learning's format. Anchors index ``embeddings``;
            positives and negatives index ``ref_embeddings`` when it is set, else ``embeddings``.
        ref_embeddings (torch.Tensor | None): The reference pool mined against, ``(M, D)``: the global
            batch over ranks (cross-rank mining) and the cross-batch memory, or ``None`` when the pool is
            the microbatch itself. This rank's own rows inside it keep their gradient.
        ref_labels (torch.Tensor | None): The pool's labels.
        strategy (str): The mining strategy that produced ``indices_tuple``.
        global_mean (bool): ``True`` when the pool spans ranks; losses of :mod:`composer_dynsample.losses`
            then average over the tuples of all ranks, so that DDP's gradient average equals the gradient
            of one process on the concatenated batch.
        outputs (Any): What the model's forward returned, untouched.
        stats (dict[str, torch.Tensor]): The step's statistics, 0-d tensors on the embeddings' device
            (:func:`~composer_dynsample.mining.mining_statistics`); the algorithm reads them when it logs.
        duplicate_ids (torch.Tensor | None): This rank's ``(B,)`` duplicate ids (e.g. ``text_hash``), when
            the algorithm reads them (``duplicate_key``): equal ids mark the same sample under different
            labels, which must not serve as each other's negatives
            (:mod:`composer_dynsample.mining.duplicates`). The mined tuples already leave such negatives out.
        ref_duplicate_ids (torch.Tensor | None): The pool's duplicate ids, set with ``ref_embeddings``.
        checks_deferred (bool): The embeddings' value checks (NaN, inf, float32 overflow) are made on the
            device and read later (:func:`~composer_dynsample.mining.step.step_health`): :func:`~composer_dynsample.
            mined_loss` passes ``values_checked=True`` to a loss that takes it, which then reads none either.
        tuples_read (bool): Whether ``indices_tuple`` was read since the algorithm handed the batch over; a
            loss that never reads it trains on every tuple of the batch, and the algorithm warns once.
    """

    embeddings: torch.Tensor
    labels: torch.Tensor
    indices_tuple: tuple[torch.Tensor, ...]
    ref_embeddings: torch.Tensor | None = None
    ref_labels: torch.Tensor | None = None
    strategy: str = ""
    global_mean: bool = False
    outputs: Any = None
    stats: dict[str, torch.Tensor] = field(default_factory=dict)
    duplicate_ids: torch.Tensor | None = None
    ref_duplicate_ids: torch.Tensor | None = None
    checks_deferred: bool = False
    tuples_read: bool = field(default=False, repr=False, compare=False)

    def __getattribute__(self, name: str) -> Any:
        # Reading the tuples marks them read: the algorithm resets the mark once it is done with the batch,
        # and warns when the loss never reads them (their mining is then thrown away).
        if name == "indices_tuple":
            object.__setattr__(self, "tuples_read", True)
        return object.__getattribute__(self, name)

    @property
    def pool_embeddings(self) -> torch.Tensor:
        """What positives and negatives index: ``ref_embeddings`` if set, else ``embeddings``."""
        return self.embeddings if self.ref_embeddings is None else self.ref_embeddings

    @property
    def num_tuples(self) -> int:
        """The number of mined triplets, or of mined positive plus negative pairs."""
        if len(self.indices_tuple) == 3:
            return int(self.indices_tuple[0].numel())
        return int(self.indices_tuple[0].numel() + self.indices_tuple[2].numel())
