"""Composer models for metric learning."""

from composer_dynsample.models.embedding_model import EmbeddingModel

__all__ = ["EmbeddingModel"]
