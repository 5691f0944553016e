"""The Hugging Face ``transformers`` encoder: token ids and an attention mask to ``(B, embedding_dim)``.

:class:`TransformerEncoder` wraps any ``AutoModel``, from a local directory or from a config (random
init), with mean or CLS pooling and an optional projection. It reads the same features as the other
text encoders (see :mod:`composer_dynsample.models.text`); ``transformers`` is imported only when one
is built. It is importable from :mod:`composer_dynsample.models.text` too.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from composer_dynsample.models.tokens import (
    _positive,
    _projection,
    import_text_extra,
    masked_mean_pool,
    token_inputs,
)
from composer_dynsample.validation import InputTypeError, check_choice

__all__ = ["TRANSFORMER_POOLINGS", "TransformerEncoder"]

TRANSFORMER_POOLINGS = ("mean", "cls")


class TransformerEncoder(nn.Module):
    """A Hugging Face ``transformers`` encoder (``AutoModel``) with mean or CLS pooling.

    Built from a local model directory (``path``: ``from_pretrained`` with ``local_files_only``; never a
    download) or from a config (``config``: ``{"model_type": "bert", "hidden_size": ..., ...}``, random
    init through ``AutoConfig.for_model``). The model's own pooler (BERT's ``pooler``, unused by mean
    or CLS pooling of the hidden states) is removed, so that every parameter takes part in the loss, as
    DDP requires. ``"mean"`` pooling averages the last hidden states over ``attention_mask``; ``"cls"``
    takes the first position's. An optional linear projection maps them to ``embedding_dim``.
    :func:`~composer_dynsample.export.export_sentence_transformers` writes the same model as a
    sentence-transformers directory.

    Dropout comes from the model's config (``hidden_dropout_prob`` and ``attention_probs_dropout_prob``
    for BERT); with ``EmbeddingModel(forward_chunk_size=N)`` the recomputation replays its masks.

    Args:
        vocab_size (int, optional): The tokenizer's vocabulary size (the data's). With ``config`` it sets
            the embedding table's size (a ``vocab_size`` in ``config`` must agree); with ``path`` it must
            not exceed the model's. Input ids are checked against it. Default: ``None``, the model's.
        path (str | os.PathLike, optional): A local directory holding a Hugging Face model. Default: ``None``.
        config (Mapping[str, Any], optional): ``model_type`` and the config's other arguments.
            Default: ``None``. Exactly one of ``path`` and ``config`` is given.
        pooling (str): ``"mean"`` or ``"cls"``. Default: ``"mean"``.
        embedding_dim (int, optional): Project to this dimension. Default: ``None``, the hidden size.

    Raises:
        ValueError: If ``path`` is not a local model directory, ``config`` names an unknown model type or
            argument, ``vocab_size`` disagrees with the model, or an argument is out of range.

    Example:
        >>> config = {"model_type": "bert", "hidden_size": 16, "num_hidden_layers": 1,
        ...           "num_attention_heads": 2, "intermediate_size": 32}
        >>> encoder = TransformerEncoder(vocab_size=50, config=config, embedding_dim=8)
        >>> features = {"input_ids": torch.tensor([[1, 7, 9, 0]]), "attention_mask": torch.tensor([[1, 1, 1, 0]])}
        >>> encoder(features).shape
        torch.Size([1, 8])
    """

    def __init__(
        self,
        *,
        vocab_size: int | None = None,
        path: str | os.PathLike[str] | None = None,
        config: Mapping[str, Any] | None = None,
        pooling: str = "mean",
        embedding_dim: int | None = None,
    ) -> None:
        super().__init__()
        self.pooling = check_choice("pooling", pooling, TRANSFORMER_POOLINGS)
        if vocab_size is not None:
            vocab_size = _positive("vocab_size", vocab_size)
        if (path is None) == (config is None):
            given = "both" if path is not None else "neither"
            raise ValueError(
                "TransformerEncoder needs exactly one of path (a local model directory) and config "
                f"(a model_type and its sizes), got {given}."
            )
        model = _load_pretrained(path) if path is not None else _from_config(config, vocab_size)
        table = model.get_input_embeddings().num_embeddings
        if vocab_size is not None and vocab_size > table:
            raise ValueError(
                f"vocab_size is {vocab_size} (the tokenizer's) but the model at {str(path)!r} embeds only "
                f"{table} tokens; use the model's own tokenizer."
            )
        self.vocab_size = table if vocab_size is None else vocab_size
        if getattr(model, "pooler", None) is not None:
            model.pooler = None  # its output is never used: DDP would wait for its gradients forever
        self.model = model
        self.projection, self.embedding_dim = _projection(model.config.hidden_size, embedding_dim)
        self.arguments = {
            "vocab_size": self.vocab_size,
            "pooling": self.pooling,
            "embedding_dim": embedding_dim,
        }

    def forward(self, features: Any) -> torch.Tensor:
        """Embed the text features (see the module docstring) to ``(B, embedding_dim)``."""
        ids, mask = token_inputs(features, type(self).__name__, self.vocab_size)
        extra = {}
        if isinstance(features, Mapping) and "token_type_ids" in features:
            extra["token_type_ids"] = features["token_type_ids"]
        outputs = self.model(input_ids=ids, attention_mask=mask, **extra)
        hidden = outputs.last_hidden_state if hasattr(outputs, "last_hidden_state") else outputs[0]
        pooled = hidden[:, 0] if self.pooling == "cls" else masked_mean_pool(hidden, mask)
        return pooled if self.projection is None else self.projection(pooled)


def _load_pretrained(path: str | os.PathLike[str]) -> nn.Module:
    """``AutoModel.from_pretrained`` from a local directory only; a one-line error for anything else."""
    if not isinstance(path, (str, os.PathLike)):
        raise InputTypeError(f"path must be a local directory (a string), got {type(path).__name__}.")
    directory = Path(path).expanduser()
    if not (directory / "config.json").is_file():
        reason = "holds no config.json" if directory.is_dir() else "does not exist"
        raise ValueError(
            f"path must be a local directory holding a Hugging Face model (config.json and weights); "
            f"{str(path)!r} {reason}. TransformerEncoder never downloads: save the model there first."
        )
    auto_model = import_text_extra("transformers", "TransformerEncoder").AutoModel
    try:
        return _without_pooler(auto_model.from_pretrained, str(directory), local_files_only=True)
    except (OSError, ValueError) as error:
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise ValueError(f"path {str(path)!r}: the model could not be loaded: {first_line}") from error


def _from_config(config: Any, vocab_size: int | None) -> nn.Module:
    """A randomly initialised ``AutoModel`` of ``config``'s ``model_type`` and arguments."""
    if not isinstance(config, Mapping) or not isinstance(config.get("model_type"), str):
        raise ValueError(
            f"config must be a mapping with a 'model_type' (such as 'bert') and the model's sizes, got {config!r}."
        )
    transformers = import_text_extra("transformers", "TransformerEncoder")
    auto_config = transformers.AutoConfig
    arguments = {key: value for key, value in config.items() if key != "model_type"}
    model_type = config["model_type"]
    try:
        defaults = auto_config.for_model(model_type)
    except ValueError:
        raise ValueError(
            f"config['model_type'] must be a transformers model type such as 'bert', 'roberta' or "
            f"'distilbert', got {model_type!r}."
        ) from None
    known = set(defaults.to_dict()) | {"attn_implementation"}
    unknown = sorted(set(arguments) - known)
    if unknown:
        close = difflib.get_close_matches(unknown[0], sorted(known), n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise ValueError(f"config: {model_type!r} has no argument {unknown[0]!r}{hint}")
    if vocab_size is None and "vocab_size" not in arguments:
        raise ValueError("TransformerEncoder with a config needs vocab_size (the tokenizer's).")
    if vocab_size is not None and arguments.setdefault("vocab_size", vocab_size) != vocab_size:
        raise ValueError(
            f"config['vocab_size'] is {arguments['vocab_size']} but vocab_size (the tokenizer's) is "
            f"{vocab_size}; leave vocab_size out of config."
        )
    return _without_pooler(transformers.AutoModel.from_config, auto_config.for_model(model_type, **arguments))


def _without_pooler(build: Any, *args: Any, **kwargs: Any) -> nn.Module:
    """``build(*args, add_pooling_layer=False)`` where the model takes it (BERT, RoBERTa...), else ``build``."""
    try:
        return build(*args, add_pooling_layer=False, **kwargs)
    except TypeError as error:
        if "add_pooling_layer" not in str(error):
            raise
        return build(*args, **kwargs)
