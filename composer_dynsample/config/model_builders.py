"""The ``model`` section's builders: the encoder, its inputs read off the data, the loss, the model.

``model.encoder`` is built as ``target(**keys)``, with ``in_features``, ``in_channels``,
``input_length`` and ``input_size`` filled from the data's item shape, and a text encoder's
``vocab_size`` from the tokenizer, when the target takes them and the config leaves them out;
``two_tower`` builds its ``query_encoder`` and ``passage_encoder`` sections as ``model.encoder``
sections. ``model.loss`` is ``target(**keys)``. :func:`build_model` puts them into the
:class:`~composer_dynsample.EmbeddingModel` with the eval metrics of the data's protocol. Every name
here is importable from :mod:`composer_dynsample.config.builders` too.

:func:`check_positions` compares the data's ``max_length`` with the positions of each transformer
encoder (its ``config``, or the ``config.json`` of its ``path``), before any data is loaded; the encoder
builder checks it again with the loaded data's.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from omegaconf import DictConfig

from composer_dynsample.config.evaluation import eval_metrics
from composer_dynsample.config.loading import evaluation_config, section
from composer_dynsample.config.registries import (
    DATASETS,
    ENCODERS,
    LOSSES,
    MODEL_OWNED,
    peek_entry,
    resolve_entry,
)
from composer_dynsample.config.registry import (
    COMPONENT_KEY,
    ConfigError,
    Registered,
    call,
    check_keys,
    check_types,
    parameters,
)

if TYPE_CHECKING:
    import torch

    from composer_dynsample.data import DatasetSplits
    from composer_dynsample.models.embedding_model import EmbeddingModel

__all__ = [
    "build_encoder",
    "build_loss",
    "build_model",
    "check_encoder",
    "check_model_keys",
    "check_positions",
]

_TOWERS = ("query_encoder", "passage_encoder")
# What an encoder takes tells the data it reads: feature tensors of a shape, or token ids.
_TENSOR_INPUTS = ("in_features", "in_channels", "input_length", "input_size")
_TEXT_INPUTS = ("vocab_size",)
# Values the encoder builder fills in from the data; stand-ins while the data is not loaded yet.
_SHAPE_STAND_INS = {"in_features": 1, "in_channels": 1, "input_length": 1, "input_size": 1, "vocab_size": 1}


def build_encoder(cfg: DictConfig, splits: DatasetSplits) -> torch.nn.Module:
    """Build ``model.encoder``, filling the inputs it takes from the data: its item shape, or its vocabulary."""
    return _build_encoder(
        "model.encoder", section(section(cfg, "model", "model"), "encoder", "model.encoder"), splits
    )


def _data_inputs(path: str, values: dict[str, Any], splits: DatasetSplits) -> dict[str, Any]:
    """What an encoder may read off the data: a text tokenizer's ``vocab_size``, or the items' sizes."""
    from composer_dynsample.data import TextStore

    if isinstance(splits.train, TextStore):
        return {"vocab_size": splits.train.vocab_size}
    feature_shape = splits.train.feature_shape
    inferred = {
        "in_features": int(math.prod(feature_shape)),
        "in_channels": feature_shape[0] if len(feature_shape) >= 2 else 1,
        "input_length": feature_shape[-1],
        "input_size": list(feature_shape[1:]) if len(feature_shape) >= 3 else feature_shape[-1],
    }
    if len(feature_shape) == 2 and "input_size" in parameters(peek_entry(path, values, ENCODERS)):
        inferred["in_channels"], inferred["input_size"] = 1, list(feature_shape)  # (H, W) images
    return inferred


def _check_reads_the_data(path: str, values: dict[str, Any], splits: DatasetSplits) -> None:
    """A text encoder on feature tensors, or a tensor encoder on texts, is refused in one line."""
    from composer_dynsample.data import TextStore

    takes = parameters(peek_entry(path, values, ENCODERS))
    reads_text = any(key in takes for key in _TEXT_INPUTS) or all(key in takes for key in _TOWERS)
    reads_tensors = any(key in takes for key in _TENSOR_INPUTS)
    named = values.get(COMPONENT_KEY, values.get("name"))
    if isinstance(splits.train, TextStore) and reads_tensors and not reads_text:
        raise ConfigError(
            f"{path}: {named!r} reads feature tensors, but data {splits.name!r} holds texts (token ids); use "
            "a text encoder: 'transformer', 'bag_of_tokens', 'text_cnn' or 'two_tower'."
        )
    if not isinstance(splits.train, TextStore) and reads_text:
        raise ConfigError(
            f"{path}: {named!r} reads token ids, but data {splits.name!r} holds feature tensors of shape "
            f"{splits.train.feature_shape}; use 'mlp', 'conv1d' or 'conv2d', or text data "
            "('pairs', 'texts', 'code_search')."
        )


def _tower_section(path: str, tower: str, value: Any) -> dict[str, Any]:
    if not isinstance(value, Mapping):
        raise ConfigError(
            f"{path}.{tower} must be an encoder section (name: bag_of_tokens, ... or _component_: ...), "
            f"got {value!r}."
        )
    return dict(value)


def _build_encoder(path: str, values: dict[str, Any], splits: DatasetSplits) -> torch.nn.Module:
    _check_reads_the_data(path, values, splits)
    inferred = _data_inputs(path, values, splits)
    entry, name, kwargs, _ = resolve_entry(path, values, ENCODERS, supplied=inferred)
    feature_shape = getattr(splits.train, "feature_shape", ())
    if name == "conv1d" and len(feature_shape) not in (1, 2):
        raise ConfigError(
            f"{path}: 'conv1d' needs sequences (N, L) or (N, C, L), but the data's items have shape "
            f"{feature_shape}; use 'mlp' for other data."
        )
    if all(key in parameters(entry.target) for key in _TOWERS):  # two towers: each its own section
        for tower in _TOWERS:
            kwargs[tower] = _build_encoder(
                f"{path}.{tower}", _tower_section(path, tower, kwargs[tower]), splits
            )
    max_length = getattr(splits.train, "max_length", None)
    if _is_transformer(entry.target) and isinstance(max_length, int):
        _check_transformer_positions(path, kwargs, max_length)
    encoder = call(path, entry, kwargs)
    import torch

    if not isinstance(encoder, torch.nn.Module):
        raise ConfigError(f"{path}: {name} returned {type(encoder).__name__}, not a torch.nn.Module.")
    return encoder


def build_loss(cfg: DictConfig) -> torch.nn.Module:
    """Build ``model.loss`` (default: ``TripletMarginLoss(margin=0.2)``)."""
    from composer_dynsample.losses import TripletMarginLoss

    model = section(cfg, "model", "model")
    if model.get("loss") is None:
        return TripletMarginLoss(margin=0.2)
    entry, _, kwargs, _ = resolve_entry("model.loss", section(model, "loss", "model.loss"), LOSSES)
    return call("model.loss", entry, kwargs)


def build_model(cfg: DictConfig, splits: DatasetSplits) -> EmbeddingModel:
    """Build the :class:`~composer_dynsample.EmbeddingModel` with the eval metrics of the data's protocol.

    See :mod:`composer_dynsample.config.evaluation`: Recall@K, MAP@R and R-precision, or for text pairs
    MRR, MRR@10, Recall@K, nDCG@10 and CodeSearchNet's MRR.
    """
    from composer_dynsample.models.embedding_model import EmbeddingModel

    model = section(cfg, "model", "model")
    check_model_keys(model, parameters(EmbeddingModel))
    if model.get("encoder") is None:
        raise ConfigError(
            f"model needs an 'encoder' section; valid names: {sorted(ENCODERS)}, or a '_component_' dotted path."
        )
    encoder = build_encoder(cfg, splits)
    loss = build_loss(cfg)
    metrics = eval_metrics(evaluation_config(cfg), splits)
    kwargs = {key: value for key, value in model.items() if key not in ("encoder", "loss")}
    return call("model", Registered(EmbeddingModel), {**kwargs, "eval_metrics": metrics}, encoder, loss)


def check_encoder(path: str, values: dict[str, Any]) -> None:
    """The keys and value types of an encoder section, and of each tower's of a two-tower encoder."""
    if not values:
        return
    entry, _, kwargs, _ = resolve_entry(path, values, ENCODERS, supplied=_SHAPE_STAND_INS)
    if all(key in parameters(entry.target) for key in _TOWERS):
        for tower in _TOWERS:
            check_encoder(f"{path}.{tower}", _tower_section(path, tower, kwargs.pop(tower)))
    check_types(path, entry, kwargs)


def check_model_keys(model: Mapping[str, Any], takes: Iterable[str]) -> None:
    """The ``model`` section's keys: ``encoder``, ``loss`` and the arguments ``takes`` names (the
    ``EmbeddingModel``'s) that the builders do not supply themselves."""
    valid = [key for key in takes if key not in MODEL_OWNED] + ["encoder", "loss"]
    check_keys("model", model, valid, "EmbeddingModel")


def check_positions(cfg: DictConfig) -> None:
    """``data.max_length`` against the positions of each transformer of ``model.encoder``, data unloaded.

    The length is the data section's ``max_length``, else its loader's default; a transformer's
    positions are read off its ``config`` (or the model type's default) or its folder's ``config.json``,
    as :func:`~composer_dynsample.models.transformer.position_limit` says. Sections that name no
    transformer, or data without a ``max_length``, are left alone.

    Raises:
        ConfigError: If ``data.max_length`` is more tokens than a transformer has positions for.
    """
    data = section(cfg, "data", "data")
    if not data:
        return
    max_length = data.get("max_length")
    if "max_length" not in data:
        default = parameters(peek_entry("data", data, DATASETS)).get("max_length")
        max_length = None if default is None else default.default
    if isinstance(max_length, bool) or not isinstance(max_length, int):
        return
    encoder = section(section(cfg, "model", "model"), "encoder", "model.encoder")
    _check_section_positions("model.encoder", encoder, max_length)


def _check_section_positions(path: str, values: dict[str, Any], max_length: int) -> None:
    """:func:`check_positions` for one encoder section and, of two towers, each tower's."""
    if not values:
        return
    target = peek_entry(path, values, ENCODERS)
    if all(key in parameters(target) for key in _TOWERS):
        for tower in _TOWERS:
            _check_section_positions(
                f"{path}.{tower}", _tower_section(path, tower, values.get(tower)), max_length
            )
    elif _is_transformer(target):
        _check_transformer_positions(path, values, max_length)


def _is_transformer(target: Any) -> bool:
    from composer_dynsample.models.transformer import TransformerEncoder

    return isinstance(target, type) and issubclass(target, TransformerEncoder)


def _check_transformer_positions(path: str, values: Mapping[str, Any], max_length: int) -> None:
    """A one-line ConfigError when texts of ``max_length`` tokens do not fit the transformer's positions."""
    from composer_dynsample.models.transformer import position_limit

    model_path, config = values.get("path"), values.get("config")
    if model_path is not None and not isinstance(model_path, (str, os.PathLike)):
        return  # the encoder names a path of the wrong type itself
    limit = position_limit(path=model_path) if model_path is not None else position_limit(config=config)
    if limit is None or max_length <= limit.tokens:
        return
    positions, reserved = limit.max_position_embeddings, limit.max_position_embeddings - limit.tokens
    if model_path is not None:
        where = f"the model of {path}.path ({str(model_path)!r}) has max_position_embeddings {positions} (its config.json)"
        fix = f"set data.max_length to at most {limit.tokens}"
    else:
        key = f"{path}.config.max_position_embeddings"
        where = (
            f"{key} is {positions}"
            if not limit.default
            else f"{key} is left at {positions}, the default for model_type {limit.model_type!r}"
        )
        fix = f"set data.max_length to at most {limit.tokens}, or {key} to at least {max_length + reserved}"
    kept = (
        f" ({limit.model_type!r} keeps {reserved} of them for padding: {limit.tokens} tokens)"
        if reserved
        else ""
    )
    raise ConfigError(
        f"data.max_length is {max_length} but {where}{kept}: a longer text has no position embedding; {fix}."
    )
