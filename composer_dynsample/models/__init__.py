"""Composer models and encoders for metric learning.

The encoders are plain torch modules; only :class:`EmbeddingModel` needs Composer, so it is imported on
first use (PEP 562) and building an encoder never waits for Composer. The text encoders read token ids
(``transformers`` is imported only when a :class:`TransformerEncoder` is built).
"""

from __future__ import annotations

from composer_dynsample._lazy import lazy_exports
from composer_dynsample.models.encoders import Conv1dEncoder, Conv2dEncoder, MLPEncoder
from composer_dynsample.models.text import BagOfTokensEncoder, TextCNNEncoder, TwoTowerEncoder
from composer_dynsample.models.transformer import TransformerEncoder

__all__ = [
    "BagOfTokensEncoder",
    "Conv1dEncoder",
    "Conv2dEncoder",
    "EmbeddingModel",
    "MLPEncoder",
    "TextCNNEncoder",
    "TransformerEncoder",
    "TwoTowerEncoder",
]

__getattr__, __dir__ = lazy_exports(
    __name__, {"composer_dynsample.models.embedding_model": "EmbeddingModel"}, globals()
)
