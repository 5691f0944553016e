"""Export a trained text encoder for use outside this project: Hugging Face and sentence-transformers.

Each format is a module of its own, and the public names are re-exported here:

* :mod:`~composer_dynsample.export.huggingface`: :func:`export_huggingface`, a Hugging Face folder
  (``AutoModel`` and ``AutoTokenizer`` load it), and :func:`load_exported_encoder`, which reads it back;
* :mod:`~composer_dynsample.export.sentence_transformers`: :func:`export_sentence_transformers`, a
  sentence-transformers folder with a model card, built of the modules of
  :mod:`~composer_dynsample.export.sentence_modules`;
* :mod:`~composer_dynsample.export.model_card`: :func:`model_card`, that folder's ``README.md``, and
  :func:`run_metrics`, a run's ``metrics.json``;
* :mod:`~composer_dynsample.export.tokenizer`: :func:`pretrained_tokenizer`, the tokenizer saved beside
  the model;
* :mod:`~composer_dynsample.export.staging`: the atomic write both exports share: a failed export leaves
  nothing behind, never a part of a model.

``transformers`` and ``sentence-transformers`` (the ``[text]`` extra) are imported when a function runs.
"""

from __future__ import annotations

from composer_dynsample.export.huggingface import export_huggingface, load_exported_encoder
from composer_dynsample.export.model_card import model_card, run_metrics
from composer_dynsample.export.sentence_transformers import export_sentence_transformers
from composer_dynsample.export.tokenizer import pretrained_tokenizer

__all__ = [
    "export_huggingface",
    "export_sentence_transformers",
    "load_exported_encoder",
    "model_card",
    "pretrained_tokenizer",
    "run_metrics",
]
