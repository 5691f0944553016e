"""Tiny model folders for the tests: a Hugging Face BERT folder and a sentence-transformers folder of it.

The BERT is 16 wide, one layer, :data:`POSITIONS` positions, with a WordPiece tokenizer trained here;
the tests of model folders (tests/models, tests/cli, tests/config) and of the fine-tuning benchmark
build on them. Each skips its test when ``tokenizers``, ``transformers`` (or, for the
sentence-transformers folder, ``sentence_transformers``) is not installed.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.data.text.helpers import pair_rows

TEXTS = [text for row in pair_rows(64, seed=0) for text in row.values()]
POSITIONS = 64


def save_bert_folder(folder: Path, *, seed: int = 0, texts: list[str] = TEXTS) -> Path:
    """A tiny BERT (16 wide, one layer, 64 positions) and a WordPiece tokenizer trained on ``texts``,
    saved as a Hugging Face folder (``save_pretrained`` of both)."""
    pytest.importorskip("tokenizers")
    transformers = pytest.importorskip("transformers")
    from composer_dynsample.data.text.tokenizer import train_tokenizer
    from composer_dynsample.export import pretrained_tokenizer

    tokenizer = pretrained_tokenizer(train_tokenizer(texts, vocab_size=200))
    torch.manual_seed(seed)
    config = transformers.BertConfig(
        vocab_size=len(tokenizer),
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=POSITIONS,
    )
    transformers.BertModel(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def save_sentence_folder(
    folder: Path,
    *,
    pooling: str = "cls",
    normalize: bool = True,
    max_seq_length: int | None = 20,
    include_prompt: bool = True,
    seed: int = 0,
    texts: list[str] = TEXTS,
) -> Path:
    """A sentence-transformers folder of :func:`save_bert_folder`'s model (its weights drawn with ``seed``,
    its tokenizer the same whatever the seed): Transformer, Pooling in ``pooling`` mode (several joined by
    ``+``: ``"mean+max"``) with ``include_prompt`` and, when ``normalize``, Normalize; ``max_seq_length``
    in ``sentence_bert_config.json``; ``texts`` train its tokenizer (other texts: another vocabulary)."""
    sentence_transformers = pytest.importorskip("sentence_transformers")
    from sentence_transformers import models

    hf = save_bert_folder(folder.with_name(f"{folder.name}-hf"), seed=seed, texts=texts)
    modes = tuple(pooling.split("+"))
    mode = modes[0] if len(modes) == 1 else modes
    steps = [models.Transformer(str(hf)), models.Pooling(16, mode, include_prompt=include_prompt)]
    steps += [models.Normalize()] if normalize else []
    sentence_transformers.SentenceTransformer(modules=steps, device="cpu").save(str(folder))
    if max_seq_length is not None:
        settings = folder / "sentence_bert_config.json"
        values = json.loads(settings.read_text()) if settings.is_file() else {}
        settings.write_text(json.dumps({**values, "max_seq_length": max_seq_length}))
    return folder
