"""composer-dynsample: model-aware sampling for metric learning with MosaicML Composer.

The public names are re-exported here and imported on first use (PEP 562), so ``import
composer_dynsample`` (and ``composer-dynsample --help``) does not pay for importing Composer and torch:

- samplers: :class:`PKBatchSampler`, :class:`HardClassPKBatchSampler`, :class:`TwoStreamBatchSampler`,
  :class:`DistributedBatchSampler`, :func:`build_dataloader`;
- callbacks: :class:`SetSamplerEpoch`, :class:`ProgressLines` (plain progress lines for a log file);
- algorithms: :class:`HardNegativeMining` (mining at ``AFTER_FORWARD``), :class:`CrossBatchMemory`,
  :class:`EmbeddingTable` (an embedding per training sample), :class:`BatchAugmentation`,
  :class:`MinedBatch` (what the loss receives), the miners in :mod:`composer_dynsample.mining`;
- models and losses: :class:`EmbeddingModel`, :class:`Conv1dEncoder`, :class:`Conv2dEncoder`, :class:`MLPEncoder`,
  the text encoders :class:`TransformerEncoder`, :class:`BagOfTokensEncoder`, :class:`TextCNNEncoder`,
  :class:`TwoTowerEncoder`,
  :class:`TripletMarginLoss`, :class:`ContrastiveLoss`, :class:`MultiSimilarityLoss`, :class:`InfoNCELoss`,
  :class:`MatryoshkaLoss`, :func:`mined_loss` (a loss on the :class:`MinedBatch` a model's ``loss`` receives);
- data: :class:`IndexDataset`, :class:`GatherCollate`, :class:`TensorStore` (index-only datasets and the
  batched collate), loaders in :mod:`composer_dynsample.data`;
- evaluation: :class:`RetrievalGallery` (the train-set gallery for retrieval metrics, in
  :mod:`composer_dynsample.metrics`); the YAML builders in :mod:`composer_dynsample.config` behind
  ``composer-dynsample train``.

Example:
    >>> import composer_dynsample
    >>> composer_dynsample.PKBatchSampler.__name__
    'PKBatchSampler'
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from composer_dynsample._lazy import lazy_exports

__version__ = "0.1.0"

# Each defining module and the public names it provides.
_MODULES: dict[str, str] = {
    "composer_dynsample.samplers.dataloader": "BatchSamplerDataLoader build_dataloader",
    "composer_dynsample.losses": "ContrastiveLoss InfoNCELoss MatryoshkaLoss MultiSimilarityLoss TripletMarginLoss "
    "mined_loss",
    "composer_dynsample.models": "BagOfTokensEncoder Conv1dEncoder Conv2dEncoder EmbeddingModel MLPEncoder "
    "TextCNNEncoder TransformerEncoder TwoTowerEncoder",
    "composer_dynsample.algorithms": "BatchAugmentation CrossBatchMemory EmbeddingTable HardNegativeMining",
    "composer_dynsample.samplers": "DistributedBatchSampler HardClassPKBatchSampler NeighbourBatchSampler "
    "MinedNegativesPKBatchSampler PKBatchSampler SupportsSetEpoch TwoStreamBatchSampler",
    "composer_dynsample.data": "GatherCollate IndexDataset TensorStore TextCollate TextStore",
    "composer_dynsample.mining.mined_batch": "MinedBatch",
    "composer_dynsample.callbacks": "CheckpointOnInterrupt ProgressLines RetrievalGallery SetSamplerEpoch",
    "composer_dynsample.metrics": "RankingMetrics",
}

__all__ = [
    "BagOfTokensEncoder",
    "BatchAugmentation",
    "BatchSamplerDataLoader",
    "CheckpointOnInterrupt",
    "ContrastiveLoss",
    "Conv1dEncoder",
    "Conv2dEncoder",
    "CrossBatchMemory",
    "DistributedBatchSampler",
    "EmbeddingModel",
    "EmbeddingTable",
    "GatherCollate",
    "HardClassPKBatchSampler",
    "HardNegativeMining",
    "IndexDataset",
    "InfoNCELoss",
    "MLPEncoder",
    "MatryoshkaLoss",
    "MinedBatch",
    "MinedNegativesPKBatchSampler",
    "MultiSimilarityLoss",
    "NeighbourBatchSampler",
    "PKBatchSampler",
    "ProgressLines",
    "RankingMetrics",
    "RetrievalGallery",
    "SetSamplerEpoch",
    "SupportsSetEpoch",
    "TensorStore",
    "TextCNNEncoder",
    "TextCollate",
    "TextStore",
    "TransformerEncoder",
    "TripletMarginLoss",
    "TwoStreamBatchSampler",
    "TwoTowerEncoder",
    "build_dataloader",
    "mined_loss",
]

if TYPE_CHECKING:
    from composer_dynsample.algorithms import (
        BatchAugmentation,
        CrossBatchMemory,
        EmbeddingTable,
        HardNegativeMining,
    )
    from composer_dynsample.callbacks import (
        CheckpointOnInterrupt,
        ProgressLines,
        RetrievalGallery,
        SetSamplerEpoch,
    )
    from composer_dynsample.data import GatherCollate, IndexDataset, TensorStore, TextCollate, TextStore
    from composer_dynsample.losses import (
        ContrastiveLoss,
        InfoNCELoss,
        MatryoshkaLoss,
        MultiSimilarityLoss,
        TripletMarginLoss,
        mined_loss,
    )
    from composer_dynsample.metrics import RankingMetrics
    from composer_dynsample.mining.mined_batch import MinedBatch
    from composer_dynsample.models import (
        BagOfTokensEncoder,
        Conv1dEncoder,
        Conv2dEncoder,
        EmbeddingModel,
        MLPEncoder,
        TextCNNEncoder,
        TransformerEncoder,
        TwoTowerEncoder,
    )
    from composer_dynsample.samplers import (
        DistributedBatchSampler,
        HardClassPKBatchSampler,
        MinedNegativesPKBatchSampler,
        NeighbourBatchSampler,
        PKBatchSampler,
        SupportsSetEpoch,
        TwoStreamBatchSampler,
    )
    from composer_dynsample.samplers.dataloader import BatchSamplerDataLoader, build_dataloader


__getattr__, __dir__ = lazy_exports(__name__, _MODULES, globals())
