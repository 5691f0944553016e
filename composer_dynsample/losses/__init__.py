"""Losses that consume mined tuples, with pytorch-metric-learning's call signature."""

from composer_dynsample.losses.infonce import InfoNCELoss
from composer_dynsample.losses.matryoshka import MatryoshkaLoss
from composer_dynsample.losses.mined_loss import mined_loss
from composer_dynsample.losses.per_source import PerSourceLoss
from composer_dynsample.losses.tuple_losses import (
    ContrastiveLoss,
    MultiSimilarityLoss,
    TripletMarginLoss,
    all_pairs,
    all_triplets,
)

__all__ = [
    "ContrastiveLoss",
    "InfoNCELoss",
    "MatryoshkaLoss",
    "MultiSimilarityLoss",
    "PerSourceLoss",
    "TripletMarginLoss",
    "all_pairs",
    "all_triplets",
    "mined_loss",
]
