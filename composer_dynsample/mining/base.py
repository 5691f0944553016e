"""``BaseMiner``: what every miner shares, from checking its options once to returning empty tuples.

A miner is built with its options (``SemiHardMiner(margin=0.2, distance="cosine")``), which are checked
there, and then called on tensors like pytorch-metric-learning's miners::

    miner = SemiHardMiner(margin=0.2)
    indices_tuple = miner(embeddings, labels)                      # the batch is the pool
    indices_tuple = miner(embeddings, labels, ref_emb, ref_labels)  # a memory or another pool

:meth:`BaseMiner.__call__` does the work every miner repeats: it validates the inputs
(:func:`~composer_dynsample.mining._common.validate_mining_inputs`), runs under ``torch.no_grad()``,
indexes the positives of every anchor (:class:`~composer_dynsample.mining._common.LabelIndex`) and returns
empty tuples when nothing can be mined; a subclass only writes :meth:`BaseMiner.mine`. Each miner also
says what it returns (:attr:`BaseMiner.kind`: triplets or pairs), so no caller decides that by name.
"""

from __future__ import annotations

import inspect
from typing import ClassVar, Final

import torch

from composer_dynsample.distances import check_distance
from composer_dynsample.mining._common import LabelIndex, MiningInputs, empty_indices, validate_mining_inputs
from composer_dynsample.validation import check_int

__all__ = ["KINDS", "BaseMiner"]

#: What a miner can return, with the number of index tensors: triplets ``(a, p, n)`` or pairs ``(a1, p, a2, n)``.
KINDS: Final[dict[str, int]] = {"triplets": 3, "pairs": 4}


class BaseMiner:
    """A mining strategy with its options, callable on ``(embeddings, labels[, ref_embeddings, ref_labels])``.

    Args:
        distance (str): ``"cosine"`` (default), ``"euclidean"`` or ``"squared_euclidean"``.
        chunk_size (int, optional): Anchors per distance-matrix chunk; ``None`` (default) bounds a chunk's
            working set to about 64 MiB (:data:`~composer_dynsample.mining._common.CHUNK_BYTES`).

    Raises:
        ValueError: When the miner is built, on an unknown distance, ``chunk_size < 1``, or any miner's
            option outside what its Args say (``SemiHardMiner(margin=-1)``, ``HardTopKMiner(k=0)``).
    """

    #: What :meth:`__call__` returns: ``"triplets"`` or ``"pairs"`` (a key of :data:`KINDS`).
    kind: ClassVar[str] = "triplets"
    #: Whether :meth:`mine` needs the per-anchor positives (:class:`LabelIndex`).
    uses_label_index: ClassVar[bool] = True

    def __init__(self, *, distance: str = "cosine", chunk_size: int | None = None) -> None:
        self.distance = check_distance(distance)
        self.chunk_size = None if chunk_size is None else check_int("chunk_size", chunk_size, minimum=1)

    def __call__(
        self,
        embeddings: torch.Tensor,
        labels: torch.Tensor,
        ref_embeddings: torch.Tensor | None = None,
        ref_labels: torch.Tensor | None = None,
        *,
        self_offset: int | None = None,
        values_checked: bool = False,
        max_positives: int | None = None,
    ) -> tuple[torch.Tensor, ...]:
        """Mine ``embeddings`` against the pool, under ``torch.no_grad()``.

        Anchors index ``embeddings``; positives and negatives index the pool, which is the batch itself when
        no pool is given (pytorch-metric-learning's convention). Only then does the miner exclude pairing
        anchor ``i`` with pool entry ``i``; an explicit pool is distinct samples, unless ``self_offset``
        says where it holds the anchors (passing the very same tensor objects as pool counts as no pool).

        Args:
            embeddings (torch.Tensor): ``(B, D)`` floating-point anchors.
            labels (torch.Tensor): ``(B,)`` integer labels.
            ref_embeddings (torch.Tensor, optional): ``(M, D)`` pool for positives and negatives (a memory,
                other ranks' rows). Default: the batch.
            ref_labels (torch.Tensor, optional): ``(M,)`` labels of the pool; required with ``ref_embeddings``.
            self_offset (int, optional): Where the pool holds the anchors (a memory after the batch, a
                cross-rank pool), anchor ``i`` is pool entry ``self_offset + i`` and never pairs with it.
            values_checked (bool): The caller has checked the values on the device (NaN, inf, entries too
                large for float32 distances) and built the pool itself: the miner reads none on the host.
                Default: ``False`` (the miner checks them).
            max_positives (int, optional): An upper bound of any anchor's positives in the pool, known on
                the host (a P x K batch: ``K - 1``); without it the label index reads the largest count.

        Returns:
            ``(anchors, positives, negatives)`` for triplets, ``(a1, p, a2, n)`` for pairs: 1-D int64 tensors
            on the embeddings' device (tuples of ``(0,)`` tensors when nothing is mined).

        Raises:
            ValueError: On invalid inputs (see
                :func:`~composer_dynsample.mining._common.validate_mining_inputs`).
        """
        with torch.no_grad():
            inputs = validate_mining_inputs(
                embeddings,
                labels,
                ref_embeddings,
                ref_labels,
                distance=self.distance,
                self_offset=self_offset,
                values_checked=values_checked,
            )
            if inputs.is_empty:
                return self.empty(inputs.device)
            if not self.uses_label_index:
                return self.mine(inputs, None)
            index = LabelIndex(inputs.labels, inputs.ref_labels, inputs.self_offset, max_positives)
            # Every miner needs an anchor-positive pair; no positive anywhere means an empty result (the
            # width is the largest count, or the bound the caller knows on the host).
            if index.width == 0:
                return self.empty(inputs.device)
            return self.mine(inputs, index)

    def mine(self, inputs: MiningInputs, index: LabelIndex | None) -> tuple[torch.Tensor, ...]:
        """The miner's own work on validated, non-empty inputs (``index`` is ``None`` unless it is used)."""
        raise NotImplementedError(f"{type(self).__name__} must implement mine(inputs, index).")

    def empty(self, device: torch.device | str = "cpu") -> tuple[torch.Tensor, ...]:
        """What the miner returns when it finds nothing: :attr:`kind`'s number of empty int64 tensors.

        Example:
            >>> from composer_dynsample.mining import MultiSimilarityMiner
            >>> len(MultiSimilarityMiner().empty())
            4
        """
        return empty_indices(KINDS[self.kind], torch.device(device))

    @classmethod
    def option_names(cls) -> list[str]:
        """The keyword options the miner is built with, in signature order.

        Example:
            >>> from composer_dynsample.mining import SemiHardMiner
            >>> SemiHardMiner.option_names()
            ['margin', 'fallback', 'distance', 'chunk_size']
        """
        parameters = inspect.signature(cls.__init__).parameters.values()
        return [p.name for p in parameters if p.kind is inspect.Parameter.KEYWORD_ONLY]

    def __repr__(self) -> str:
        options = ", ".join(f"{name}={getattr(self, name)!r}" for name in self.option_names())
        return f"{type(self).__name__}({options})"
