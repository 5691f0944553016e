"""Shared pieces of the text-encoder tests: a WordPiece tokenizer built from a few sentences, a tiny BERT
config, the text batch of the collate's contract and a short Trainer run.

Importing this module skips the importing test module when ``transformers`` or ``tokenizers`` is missing.
"""

from __future__ import annotations

import pytest
import torch
from composer import Trainer
from composer.core import DataSpec
from torch.utils.data import Dataset

from composer_dynsample import (
    EmbeddingModel,
    HardNegativeMining,
    InfoNCELoss,
    PKBatchSampler,
    build_dataloader,
)
from composer_dynsample.models.text import BagOfTokensEncoder, TextCNNEncoder, TransformerEncoder

pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

# Pairs of (query, passage) sharing a label: the label is the pair's index.
PAIRS = [
    ("how do i sort a list", "sorted returns a new sorted list"),
    ("read a file line by line", "open the file and iterate over its lines"),
    ("capital of france", "paris is the capital of france"),
    ("what does a cat eat", "cats eat fish and mice"),
    ("reverse a string", "slice the string with a negative step"),
    ("merge two dictionaries", "update one dict with the other dict"),
    ("count words in text", "split the text and count each word"),
    ("largest planet", "jupiter is the largest planet in the solar system"),
]
TEXTS = [text for pair in PAIRS for text in pair]
SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def build_tokenizer() -> tokenizers.Tokenizer:
    """A BERT-style WordPiece tokenizer over the test texts, adding [CLS] ... [SEP] as BERT's does.

    The vocabulary is the texts' words, their characters and the characters as word pieces, in sorted
    order: the WordPiece trainer breaks ties in hash order, so two processes (two ranks) would train
    two different vocabularies.
    """
    from tokenizers import models, normalizers, pre_tokenizers, processors

    normalizer, pre_tokenizer = normalizers.BertNormalizer(lowercase=True), pre_tokenizers.BertPreTokenizer()
    words = {
        word for text in TEXTS for word, _ in pre_tokenizer.pre_tokenize_str(normalizer.normalize_str(text))
    }
    characters = {character for word in words for character in word}
    pieces = [*SPECIAL, *sorted(words | characters), *sorted(f"##{c}" for c in characters)]
    tokenizer = tokenizers.Tokenizer(
        models.WordPiece({piece: i for i, piece in enumerate(pieces)}, unk_token="[UNK]")
    )
    tokenizer.normalizer, tokenizer.pre_tokenizer = normalizer, pre_tokenizer
    cls, sep = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", cls), ("[SEP]", sep)]
    )
    return tokenizer


TOKENIZER = build_tokenizer()
VOCAB = TOKENIZER.get_vocab_size()
PAD = TOKENIZER.token_to_id("[PAD]")


def bert_config(**overrides: object) -> dict[str, object]:
    """A tiny BERT without dropout (so chunked and unchunked runs draw no masks)."""
    config = {
        "model_type": "bert",
        "hidden_size": 16,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "intermediate_size": 32,
        "max_position_embeddings": 64,
        "hidden_dropout_prob": 0.0,
        "attention_probs_dropout_prob": 0.0,
    }
    return {**config, **overrides}


def features(
    texts: list[str],
    length: int | None = None,
    is_query: list[bool] | None = None,
    max_length: int | None = None,
) -> dict:
    """The collate's features for ``texts``: padded to the longest, or to ``length``; cut at ``max_length``."""
    tokenizer = tokenizers.Tokenizer.from_str(TOKENIZER.to_str())
    if max_length is not None:
        tokenizer.enable_truncation(max_length)
    encodings = [tokenizer.encode(text) for text in texts]
    length = length or max(len(e.ids) for e in encodings)
    ids = torch.full((len(texts), length), PAD, dtype=torch.int64)
    mask = torch.zeros(len(texts), length, dtype=torch.int64)
    for row, encoding in enumerate(encodings):
        ids[row, : len(encoding.ids)] = torch.tensor(encoding.ids)
        mask[row, : len(encoding.ids)] = 1
    flags = torch.tensor(is_query if is_query is not None else [True] * len(texts))
    return {"input_ids": ids, "attention_mask": mask, "is_query": flags}


def transformer(**kwargs: object) -> TransformerEncoder:
    """A seeded TransformerEncoder of the tiny BERT over the test vocabulary."""
    torch.manual_seed(0)
    return TransformerEncoder(vocab_size=VOCAB, config=bert_config(), **kwargs)


def bag(**kwargs: object) -> BagOfTokensEncoder:
    """A seeded BagOfTokensEncoder over the test vocabulary."""
    torch.manual_seed(0)
    return BagOfTokensEncoder(vocab_size=VOCAB, token_dim=12, **kwargs)


def cnn(**kwargs: object) -> TextCNNEncoder:
    """A seeded TextCNNEncoder over the test vocabulary."""
    torch.manual_seed(0)
    return TextCNNEncoder(vocab_size=VOCAB, token_dim=12, channels=10, **kwargs)


class PairDataset(Dataset):
    """Index-only text pairs: item ``i`` is ``(i, label)``; the collate gathers the tokens."""

    def __init__(self) -> None:
        self.labels = torch.arange(len(TEXTS)) // 2
        self.features = features(TEXTS, is_query=[i % 2 == 0 for i in range(len(TEXTS))])

    def __len__(self) -> int:
        return len(TEXTS)

    def __getitem__(self, index: int) -> tuple[int, int]:
        return index, int(self.labels[index])

    def collate(self, items: list[tuple[int, int]]) -> dict:
        """The batch contract of the text collate."""
        index = torch.tensor([i for i, _ in items])
        return {
            "features": {key: value[index] for key, value in self.features.items()},
            "labels": self.labels[index],
            "index": index,
            "text_hash": index * 7919,
        }


def text_loader(seed: int = 1) -> DataSpec:
    """4 pairs per batch (P x K = 4 x 2), sharded across ranks by the sampler."""
    dataset = PairDataset()
    loader = build_dataloader(
        dataset, PKBatchSampler(dataset.labels, 4, 2, seed=seed), collate_fn=dataset.collate
    )
    return DataSpec(loader, get_num_samples_in_batch=lambda batch: int(batch["labels"].shape[0]))


def fit_transformer(
    cross_rank: bool = False, chunk: int | None = None, steps: int = 4, adam: bool = True
) -> EmbeddingModel:
    """A few Trainer steps of a tiny BERT on the pairs, InfoNCE on batch-hard tuples.

    ``adam=False`` takes SGD steps, which keep float-rounding differences as small as they are (Adam
    divides a near-zero gradient by its own size).
    """
    model = EmbeddingModel(
        transformer(embedding_dim=8), InfoNCELoss(temperature=0.1), forward_chunk_size=chunk
    )
    optimizer = (
        torch.optim.AdamW(model.parameters(), lr=1e-2)
        if adam
        else torch.optim.SGD(model.parameters(), lr=0.5)
    )
    mining = {"cross_rank": True, "gather": "autograd"} if cross_rank else {}
    trainer = Trainer(
        model=model,
        train_dataloader=text_loader(),
        optimizers=optimizer,
        algorithms=[HardNegativeMining("batch_hard", **mining)],
        max_duration=f"{steps}ba",
        device_train_microbatch_size=8,
        progress_bar=False,
        seed=0,
    )
    trainer.fit()
    return model


def record_widths(encoder: TransformerEncoder, monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    """The ``(rows, width)`` of every batch the encoder's ``transformers`` model is run on, from now on."""
    widths: list[tuple[int, int]] = []
    forward = encoder.model.forward

    def recorded(*args: object, **kwargs: torch.Tensor) -> object:
        widths.append(tuple(kwargs["input_ids"].shape))
        return forward(*args, **kwargs)

    monkeypatch.setattr(encoder.model, "forward", recorded)
    return widths
