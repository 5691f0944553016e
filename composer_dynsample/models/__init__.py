"""Composer models and encoders for metric learning."""

from composer_dynsample.models.embedding_model import EmbeddingModel
from composer_dynsample.models.encoders import Conv1dEncoder, Conv2dEncoder, MLPEncoder

__all__ = ["Conv1dEncoder", "Conv2dEncoder", "EmbeddingModel", "MLPEncoder"]
