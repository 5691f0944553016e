"""An embedding table of the training set, written by the forward pass and identical on every rank."""

from composer_dynsample.algorithms.embedding_table.embedding_table import EmbeddingTable, class_centroids
from composer_dynsample.algorithms.embedding_table.rows import write_rows

__all__ = ["EmbeddingTable", "class_centroids", "write_rows"]
