"""The ``model`` section's builders: the encoder, its inputs read off the data, the loss, the model.

``model.encoder`` is built as ``target(**keys)``, with ``in_features``, ``in_channels``,
``input_length`` and ``input_size`` filled from the data's item shape, and a text encoder's
``vocab_size`` from the tokenizer, when the target takes them and the config leaves them out;
``two_tower`` builds its ``query_encoder`` and ``passage_encoder`` sections as ``model.encoder``
sections. ``model.loss`` is ``target(**keys)`` (wrapped in a ``MatryoshkaLoss`` by its ``matryoshka_dims``,
see :mod:`.matryoshka`). :func:`build_model` puts them into the
:class:`~composer_dynsample.EmbeddingModel` with the eval metrics of the data's protocol; for a
transformer of a model folder it normalises as the folder does (a ``Normalize`` module) unless
``model.normalize`` is set, and the encoder pools as the folder does unless ``model.encoder.pooling`` is
set. The checks of the section that need no data are in :mod:`.model_checks`.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from omegaconf import DictConfig

from composer_dynsample.config.components import (
    COMPONENT_KEY,
    ConfigError,
    Registered,
    call,
    peek_parameters,
    resolve_entry,
)
from composer_dynsample.config.evaluation import eval_metrics
from composer_dynsample.config.loading import evaluation_config, section
from composer_dynsample.config.matryoshka import split_loss_section, wrap_loss
from composer_dynsample.config.mix_data import build_source_losses
from composer_dynsample.config.model_checks import (
    TOWERS,
    check_model_keys,
    check_transformer_positions,
    folder_normalize,
    is_transformer,
    is_two_tower,
    tower_section,
)
from composer_dynsample.config.names import ENCODERS, LOSSES
from composer_dynsample.config.parameters import parameters
from composer_dynsample.data import DatasetSplits, TextStore
from composer_dynsample.losses import TripletMarginLoss
from composer_dynsample.models.embedding_model import EmbeddingModel

__all__ = ["build_encoder", "build_loss", "build_model"]

# What an encoder takes tells the data it reads: feature tensors of a shape, or token ids.
_TENSOR_INPUTS = ("in_features", "in_channels", "input_length", "input_size")
_TEXT_INPUTS = ("vocab_size",)


def build_encoder(cfg: DictConfig, splits: DatasetSplits) -> torch.nn.Module:
    """Build ``model.encoder``, filling the inputs it takes from the data: its item shape, or its vocabulary."""
    return _build_encoder(
        "model.encoder", section(section(cfg, "model", "model"), "encoder", "model.encoder"), splits
    )


def _data_inputs(path: str, values: dict[str, Any], splits: DatasetSplits) -> dict[str, Any]:
    """What an encoder may read off the data: a text tokenizer's ``vocab_size``, or the items' sizes."""
    if isinstance(splits.train, TextStore):
        return {"vocab_size": splits.train.vocab_size}
    feature_shape = splits.train.feature_shape
    inferred = {
        "in_features": int(math.prod(feature_shape)),
        "in_channels": feature_shape[0] if len(feature_shape) >= 2 else 1,
        "input_length": feature_shape[-1],
        "input_size": list(feature_shape[1:]) if len(feature_shape) >= 3 else feature_shape[-1],
    }
    if len(feature_shape) == 2 and "input_size" in peek_parameters(path, values, ENCODERS):
        inferred["in_channels"], inferred["input_size"] = 1, list(feature_shape)  # (H, W) images
    return inferred


def _check_reads_the_data(path: str, values: dict[str, Any], splits: DatasetSplits) -> None:
    """A text encoder on feature tensors, or a tensor encoder on texts, is refused in one line."""
    takes = peek_parameters(path, values, ENCODERS)
    reads_text = any(key in takes for key in _TEXT_INPUTS) or all(key in takes for key in TOWERS)
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
    if is_two_tower(entry.target):  # two towers: each its own section
        for tower in TOWERS:
            kwargs[tower] = _build_encoder(
                f"{path}.{tower}", tower_section(path, tower, kwargs[tower]), splits
            )
    max_length = getattr(splits.train, "max_length", None)
    if is_transformer(entry.target) and isinstance(max_length, int):
        check_transformer_positions(path, kwargs, max_length)
    encoder = call(path, entry, kwargs)
    if not isinstance(encoder, torch.nn.Module):
        raise ConfigError(f"{path}: {name} returned {type(encoder).__name__}, not a torch.nn.Module.")
    return encoder


def build_loss(cfg: DictConfig) -> torch.nn.Module:
    """Build ``model.loss`` (default: ``TripletMarginLoss(margin=0.2)``), in a
    :class:`~composer_dynsample.losses.MatryoshkaLoss` when it has ``matryoshka_dims``."""
    model = section(cfg, "model", "model")
    values, dims, _ = split_loss_section(section(model, "loss", "model.loss"))
    if model.get("loss") is None or (dims is not None and not values):  # the default loss, maybe wrapped
        return wrap_loss(TripletMarginLoss(margin=0.2), cfg)
    entry, _, kwargs, _ = resolve_entry("model.loss", values, LOSSES)
    return wrap_loss(call("model.loss", entry, kwargs), cfg)


def build_model(cfg: DictConfig, splits: DatasetSplits, *, metrics: bool = True) -> EmbeddingModel:
    """Build the :class:`~composer_dynsample.EmbeddingModel` with the eval metrics of the data's protocol.

    See :mod:`composer_dynsample.config.evaluation`: Recall@K, MAP@R and R-precision, or for text pairs
    MRR, MRR@10, Recall@K, nDCG@10 and CodeSearchNet's MRR. ``model.normalize`` left unset is the
    sentence-transformers folder's choice (a ``Normalize`` module) for a transformer of a ``path`` (two
    towers' folders must agree on it, see :func:`~composer_dynsample.config.model_checks.folder_normalize`).

    ``metrics=False`` builds it without eval metrics (a model that only embeds: ``export``, ``embed``).

    Raises:
        ConfigError: If a key or value is wrong.
    """
    model = section(cfg, "model", "model")
    check_model_keys(model, parameters(EmbeddingModel))
    if model.get("encoder") is None:
        raise ConfigError(
            f"model needs an 'encoder' section; valid names: {sorted(ENCODERS)}, or a '_component_' dotted path."
        )
    encoder = build_encoder(cfg, splits)
    loss = build_source_losses(cfg, build_loss) or build_loss(cfg)  # a mix: maybe a loss per source
    scores = eval_metrics(evaluation_config(cfg), splits) if metrics else {}
    kwargs = {key: value for key, value in model.items() if key not in ("encoder", "loss")}
    if kwargs.get("normalize") is None:
        stated = folder_normalize(cfg)
        if stated is not None:
            kwargs["normalize"] = stated  # whether the folder (each tower's) lists a Normalize module
    return call("model", Registered(EmbeddingModel), {**kwargs, "eval_metrics": scores}, encoder, loss)
