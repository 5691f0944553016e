"""Data beyond one machine's disk: MosaicML Streaming (MDS) shards on object storage, read by index.

- :func:`~composer_dynsample.data.streaming.convert.convert_to_mds` (``composer-dynsample convert CONFIG
  --to mds OUT``) writes a loaded data set's splits as MDS shards with a manifest
  (:mod:`~composer_dynsample.data.streaming.manifest`);
- :func:`~composer_dynsample.data.streaming.load.load_streaming` (``data: {name: streaming, remote, local,
  cache_limit}``) reads them back as the same splits, whose stores read rows by index through
  ``StreamingDataset`` (:mod:`~composer_dynsample.data.streaming.shards`): every sampler chooses the
  indices as it does for a file, so batches, resume and ranks behave as they do for the file.

Needs the ``streaming`` extra (``mosaicml-streaming`` and the compressors and clients it imports).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from composer_dynsample._lazy import lazy_exports

_MODULES: dict[str, str] = {
    "composer_dynsample.data.streaming.convert": "convert_to_mds",
    "composer_dynsample.data.streaming.load": "load_streaming",
    "composer_dynsample.data.streaming.manifest": "StreamingDataError",
    "composer_dynsample.data.streaming.shards": "ShardReader StreamingFeatures StreamingTokens close_readers",
}

__all__ = [
    "ShardReader",
    "StreamingDataError",
    "StreamingFeatures",
    "StreamingTokens",
    "close_readers",
    "convert_to_mds",
    "load_streaming",
]

if TYPE_CHECKING:
    from composer_dynsample.data.streaming.convert import convert_to_mds
    from composer_dynsample.data.streaming.load import load_streaming
    from composer_dynsample.data.streaming.manifest import StreamingDataError
    from composer_dynsample.data.streaming.shards import (
        ShardReader,
        StreamingFeatures,
        StreamingTokens,
        close_readers,
    )

__getattr__, __dir__ = lazy_exports(__name__, _MODULES, globals())
