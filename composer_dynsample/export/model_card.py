"""The model card of an exported model: ``README.md`` of a sentence-transformers folder.

:func:`model_card` writes the model (encoder, pooling, projection, normalisation, ``max_seq_length``;
of two towers, which ``Router`` route is which tower, and each tower's encoder) and, given the run's
config and ``metrics.json`` (:func:`run_metrics`), the training data, the recipe and the scores; a run of
``model.loss.matryoshka_dims`` adds its dimensions, a ``truncate_dim`` example and the scores at each
dimension. A card leaves its folder's machine: a local path in the config is written as its name, a
file's with the SHA-256 of its bytes (``train.jsonl (SHA-256 ...)``), so that the card names the data
it was trained on without the directories of the machine it was trained on.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf
from torch import nn

from composer_dynsample.file_checks import file_sha256
from composer_dynsample.validation import InputTypeError, check_bool

__all__ = ["local_path_shown", "model_card", "run_metrics"]

# The config keys a model card calls the recipe.
_RECIPE = ("model.encoder", "model.loss", "model.normalize", "sampler", "optimizer", "scheduler")
_RECIPE_OF_THE_RUN = ("algorithms", "trainer.max_duration", "seed")


def unwrap_encoder(model: nn.Module, normalize: bool | None) -> tuple[nn.Module, bool]:
    """The encoder and whether embeddings are normalised: an EmbeddingModel's own, else ``normalize``."""
    if not isinstance(model, nn.Module):
        raise InputTypeError(
            f"model must be an EmbeddingModel or a text encoder, got {type(model).__name__}."
        )
    wrapped = isinstance(getattr(model, "encoder", None), nn.Module) and hasattr(model, "normalize")
    encoder = model.encoder if wrapped else model
    if normalize is None:
        return encoder, bool(model.normalize) if wrapped else True
    return encoder, check_bool("normalize", normalize)


def run_metrics(run_dir: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The ``metrics.json`` of a run directory as a dict; ``None`` when it has none that reads as one."""
    try:
        values = json.loads((Path(run_dir).expanduser() / "metrics.json").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    return values if isinstance(values, dict) else None


def model_card(
    model: nn.Module,
    *,
    max_length: int | None = None,
    normalize: bool | None = None,
    config: Mapping[str, Any] | None = None,
    metrics: Mapping[str, Any] | None = None,
    title: str = "model",
) -> str:
    """The ``README.md`` of an exported model, in plain Markdown: the model, and the run when given.

    Args:
        model (torch.nn.Module): A :class:`~composer_dynsample.models.text.TransformerEncoder`, a
            :class:`~composer_dynsample.models.text.TwoTowerEncoder` of two (exported as a ``Router``: the
            card says which route is which tower), or an ``EmbeddingModel`` around either.
        max_length (int, optional): The longest input in tokens (``max_seq_length``). Default: ``None``.
        normalize (bool, optional): Whether embeddings are L2-normalised. Default: ``None``, the model's.
        config (Mapping[str, Any], optional): The run's config: its ``data``, and the recipe (encoder, loss,
            sampler, optimizer, schedule, duration, seed). Its local paths are written as
            :func:`local_path_shown` says.
        metrics (Mapping[str, Any], optional): The run's ``metrics.json``: its scores (fractional numbers),
            beside the starting model's (``at_start``).
        title (str): The card's heading. Default: ``"model"``.

    Returns:
        str: The card.
    """
    encoder, normalized = unwrap_encoder(model, normalize)
    config = OmegaConf.create(dict(config or {}))
    data = {k: v for k, v in (config.get("data") or {}).items() if k not in ("cache_dir", "progress")}
    recipe = {key: OmegaConf.select(config, key) for key in _RECIPE + _RECIPE_OF_THE_RUN}
    dims = OmegaConf.select(config, "model.loss.matryoshka_dims")
    sections = {
        "Model": _model_lines(encoder, normalized, max_length) + _matryoshka_lines(dims),
        "Training data": [f"data.{key}: `{_shown(value)}`" for key, value in data.items()],
        "Recipe": [f"{key}: `{_shown(value)}`" for key, value in recipe.items() if value is not None],
    }
    lines = [f"# {title}", "", "A text embedding model trained with composer-dynsample.", "", "## Use", ""]
    lines += ["```python", "from sentence_transformers import SentenceTransformer", ""]
    lines += [f"model = SentenceTransformer({title!r})"]
    if _towers(encoder):  # a Router: the query route and the document route
        lines += [
            'queries = model.encode_query(["a question"])',
            'passages = model.encode_document(["a passage"])',
        ]
    else:
        lines += ['embeddings = model.encode(["a text"])']
    if dims:  # sentence-transformers keeps the first truncate_dim dimensions of every embedding
        lines += [
            f"small = SentenceTransformer({title!r}, truncate_dim={dims[-1]})  # Matryoshka: the first {dims[-1]}"
        ]
    lines += ["```"]
    for heading, items in sections.items():
        lines += ["", f"## {heading}", "", *(f"- {item}" for item in items)] if items else []
    return "\n".join(lines + _metric_lines(metrics or {}) + _matryoshka_metric_lines(metrics or {})) + "\n"


def local_path_shown(value: str) -> str:
    """A config string as a model card writes it: a local path as its name, a file's with its SHA-256.

    A string is a local path when it is absolute (``~`` expanded), or names an existing file or folder
    and has a suffix or a separator (``my_pairs.jsonl``, ``data/pairs``); URLs and other strings are
    written as they are.

    Example:
        >>> import tempfile
        >>> file = Path(tempfile.mkdtemp()) / "pairs.jsonl"
        >>> _ = file.write_text("{}\\n")
        >>> local_path_shown(str(file))
        'pairs.jsonl (SHA-256 ca3d163bab055381827226140568f3bef7eaac187cebd76878e0b63e9e442356)'
        >>> local_path_shown(str(file.parent / "folder")), local_path_shown("info_nce")
        ('folder', 'info_nce')
    """
    if "://" in value:
        return value
    path = Path(value).expanduser()
    local = path.is_absolute() or ((path.suffix or os.sep in value) and path.exists())
    if not local:
        return value
    if path.is_file():
        return f"{path.name} (SHA-256 {file_sha256(path)})"
    return path.name or value


def _without_local_paths(value: Any) -> Any:
    """``value`` with each string in it written by :func:`local_path_shown`."""
    if isinstance(value, Mapping):
        return {key: _without_local_paths(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_without_local_paths(item) for item in value]
    return local_path_shown(value) if isinstance(value, str) else value


def _towers(encoder: nn.Module) -> list[tuple[str, nn.Module]]:
    """A two-tower encoder's towers by the name the card gives them; ``[]`` for one encoder."""
    query, passage = getattr(encoder, "query_encoder", None), getattr(encoder, "passage_encoder", None)
    if isinstance(query, nn.Module) and isinstance(passage, nn.Module):
        return [("Query tower", query), ("Passage tower", passage)]
    return []


def _model_lines(encoder: nn.Module, normalized: bool, max_length: int | None) -> list[str]:
    """The card's list of the model: the encoder, where it started, pooling, projection, normalisation;
    of two towers, which route is which and each tower's encoder, pooling and projection."""
    towers = _towers(encoder)
    if not towers:
        lines = _tower_lines(encoder, "")
        longest = encoder.max_tokens
    else:
        frozen = (
            ", frozen in training (its starting weights)"
            if getattr(encoder, "frozen_passages", False)
            else ""
        )
        lines = [
            "Two towers, written as a sentence-transformers `Router`: the `query` route (`encode_query`) is the "
            "query tower, the `document` route (`encode_document`, and `encode`) the passage tower" + frozen,
            *(line for name, tower in towers for line in _tower_lines(tower, f"{name} ")),
        ]
        limits = [tower.max_tokens for _, tower in towers if tower.max_tokens is not None]
        longest = min(limits) if limits else None
    return [
        *lines,
        f"Normalisation: {'L2 (Normalize)' if normalized else 'none'}",
        f"max_seq_length: {max_length if max_length is not None else longest}",
    ]


def _tower_lines(encoder: nn.Module, prefix: str) -> list[str]:
    """A transformer encoder's lines (``prefix`` names the tower): its model, start, pooling, projection."""
    folder, config, projection = getattr(encoder, "folder", None), encoder.model.config, encoder.projection
    start = (
        f"started from `{local_path_shown(str(folder.path))}`"
        if folder is not None
        else "randomly initialised"
    )
    model = f"{type(encoder.model).__name__} ({config.model_type}, hidden size {config.hidden_size})"
    lines = [f"Encoder: {model}, {start}", f"Pooling: {encoder.pooling}"]
    lines += [
        f"Projection: linear to {projection.out_features}" if projection is not None else "Projection: none"
    ]
    return [f"{prefix}{line[0].lower() + line[1:]}" if prefix else line for line in lines]


def _metric_lines(metrics: Mapping[str, Any]) -> list[str]:
    """The card's table of scores, beside the starting model's when given; seconds (``*_s``) left out."""
    start = metrics.get("at_start") if isinstance(metrics.get("at_start"), Mapping) else {}
    cols = [metrics, start] if start else [metrics]
    keys = [key for key, value in metrics.items() if isinstance(value, float) and not key.endswith("_s")]
    rows = [[key, *(f"{c[key]:.4f}" if isinstance(c.get(key), float) else "" for c in cols)] for key in keys]
    head = [["metric", "value", "at start"][: len(cols) + 1], ["---"] * (len(cols) + 1)]
    return ["", "## Metrics", "", *("| " + " | ".join(row) + " |" for row in head + rows)] if rows else []


def _matryoshka_lines(dims: Any) -> list[str]:
    """The card's line of the Matryoshka dimensions the loss trained (``model.loss.matryoshka_dims``), if any."""
    if not dims:
        return []
    shown = ", ".join(str(dim) for dim in dims)
    return [
        f"Matryoshka dimensions: {shown} (MatryoshkaLoss): the first {dims[-1]} or more dimensions of an "
        "embedding, L2-normalised again, embed on their own (sentence-transformers' `truncate_dim`)"
    ]


def _matryoshka_metric_lines(metrics: Mapping[str, Any]) -> list[str]:
    """The card's table of the scores at each Matryoshka dimension (``metrics.json``'s ``matryoshka``)."""
    per_dim = metrics.get("matryoshka")
    if not isinstance(per_dim, Mapping) or not per_dim:
        return []
    cols = [metrics, *per_dim.values()]
    keys = [key for key, value in metrics.items() if isinstance(value, float) and not key.endswith("_s")]
    rows = [[key, *(f"{c[key]:.4f}" if isinstance(c.get(key), float) else "" for c in cols)] for key in keys]
    head = [["metric", "full", *map(str, per_dim)], ["---"] * (len(cols) + 1)]
    title = "## Metrics at each Matryoshka dimension (the first d dimensions, L2-normalised again)"
    return ["", title, "", *("| " + " | ".join(row) + " |" for row in head + rows)] if rows else []


def _shown(value: Any) -> str:
    """A config value as the card shows it, local paths as :func:`local_path_shown` writes them:
    mappings and lists as JSON (an OmegaConf node's too)."""
    value = OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value
    value = _without_local_paths(value)
    return json.dumps(value, default=str) if isinstance(value, (dict, list)) else str(value)
