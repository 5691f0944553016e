"""How long a text a ``transformers`` model takes, read off its config without building it.

:func:`position_limit` reads a model folder's ``config.json`` (or a config dict) and says how many tokens a
text may have, special tokens included: the config checks compare it with the data's ``max_length``
before anything is loaded, and :class:`~composer_dynsample.models.transformer.TransformerEncoder` checks
its inputs against :func:`token_positions`. ``transformers`` is imported only for a model type's default.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any, NamedTuple

from composer_dynsample.models.sentence_folder import read_model_folder
from composer_dynsample.models.tokens import import_text_extra

__all__ = ["PADDING_OFFSET_MODEL_TYPES", "PositionLimit", "position_limit", "token_positions"]

# Model types that number positions from ``padding_idx + 1`` as RoBERTa does: two of their
# ``max_position_embeddings`` never hold a token (RoBERTa's 514 positions take texts of 512 tokens).
PADDING_OFFSET_MODEL_TYPES = frozenset(
    {
        "camembert",
        "data2vec-text",
        "esm",
        "ibert",
        "layoutlmv3",
        "lilt",
        "longformer",
        "luke",
        "markuplm",
        "mpnet",
        "roberta",
        "roberta-prelayernorm",
        "xlm-roberta",
        "xlm-roberta-xl",
        "xmod",
    }
)


class PositionLimit(NamedTuple):
    """How long a text a transformer takes, read off its config (see :func:`position_limit`).

    Attributes:
        tokens (int): The most tokens a text may have, special tokens included.
        max_position_embeddings (int): The config's value.
        model_type (str): The config's ``model_type``.
        default (bool): Whether ``max_position_embeddings`` is the model type's default (not given).
    """

    tokens: int
    max_position_embeddings: int
    model_type: str
    default: bool = False


def token_positions(config: Mapping[str, Any]) -> int | None:
    """The most tokens per text of a model config (a dict), or ``None`` when it sets no bound.

    Example:
        >>> token_positions({"model_type": "bert", "max_position_embeddings": 512})
        512
        >>> token_positions({"model_type": "roberta", "max_position_embeddings": 514})
        512
    """
    positions = config.get("max_position_embeddings")
    if isinstance(positions, bool) or not isinstance(positions, int) or positions < 1:
        return None
    if config.get("position_biased_input") is False:  # DeBERTa's relative positions only: no absolute table
        return None
    return positions - 2 if config.get("model_type") in PADDING_OFFSET_MODEL_TYPES else positions


def position_limit(
    *, path: str | os.PathLike[str] | None = None, config: Mapping[str, Any] | None = None
) -> PositionLimit | None:
    """The longest text a :class:`~composer_dynsample.models.transformer.TransformerEncoder` of ``path`` or ``config`` takes, without building it.

    A model of ``path`` is read from the folder's ``config.json`` (JSON only, no weights; that of its
    ``Transformer`` module in a sentence-transformers folder); a ``config`` without
    ``max_position_embeddings`` takes its model type's default (``AutoConfig.for_model(model_type)``,
    512 for BERT). BERT-like models count their special tokens
    among the positions; RoBERTa-like ones (:data:`PADDING_OFFSET_MODEL_TYPES`) keep two positions for
    padding, so ``max_position_embeddings`` 514 takes 512 tokens. DeBERTa with
    ``position_biased_input: false`` has no bound.

    Args:
        path (str | os.PathLike, optional): A local model folder. Default: ``None``.
        config (Mapping[str, Any], optional): A ``model_type`` and the config's other arguments.
            Default: ``None``.

    Returns:
        PositionLimit | None: ``None`` when the config cannot be read or sets no bound (the encoder's own
        checks name a folder or config that is wrong).
    """
    if path is not None:
        try:
            directory = read_model_folder(path).model_dir  # a sentence-transformers folder's model
            values = json.loads((directory / "config.json").read_text(encoding="utf-8"))
        except (OSError, ValueError, TypeError):
            return None
        default = False
    elif isinstance(config, Mapping) and isinstance(config.get("model_type"), str):
        values, default = dict(config), "max_position_embeddings" not in config
        if default:
            values["max_position_embeddings"] = _default_positions(config["model_type"])
    else:
        return None
    tokens = token_positions(values) if isinstance(values, Mapping) else None
    if tokens is None:
        return None
    model_type = str(values.get("model_type", ""))
    return PositionLimit(tokens, values["max_position_embeddings"], model_type, default)


def _default_positions(model_type: str) -> int | None:
    """``max_position_embeddings`` of ``AutoConfig.for_model(model_type)``, or ``None``."""
    try:
        auto_config = import_text_extra("transformers", "TransformerEncoder").AutoConfig
        return getattr(auto_config.for_model(model_type), "max_position_embeddings", None)
    except (ImportError, ValueError):
        return None
