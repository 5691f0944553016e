"""Composer models and encoders for metric learning.

The encoders are plain torch modules; only :class:`EmbeddingModel` needs Composer. Every name is imported
on first use (PEP 562), so building an encoder never waits for Composer and a run loads only the encoder it
builds. The text encoders read token ids (``transformers`` is imported only when a
:class:`TransformerEncoder` is built).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from composer_dynsample._lazy import lazy_exports

# Each defining module and the public names it provides: a run imports the encoder it builds only.
_MODULES: dict[str, str] = {
    "composer_dynsample.models.embedding_model": "EmbeddingModel",
    "composer_dynsample.models.encoders": "Conv1dEncoder Conv2dEncoder MLPEncoder",
    "composer_dynsample.models.text": "BagOfTokensEncoder TextCNNEncoder TwoTowerEncoder",
    "composer_dynsample.models.transformer": "TransformerEncoder",
}

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

if TYPE_CHECKING:
    from composer_dynsample.models.embedding_model import EmbeddingModel
    from composer_dynsample.models.encoders import Conv1dEncoder, Conv2dEncoder, MLPEncoder
    from composer_dynsample.models.text import BagOfTokensEncoder, TextCNNEncoder, TwoTowerEncoder
    from composer_dynsample.models.transformer import TransformerEncoder

__getattr__, __dir__ = lazy_exports(__name__, _MODULES, globals())
