"""The sentence-transformers export of a text encoder: :func:`export_sentence_transformers`.

It writes a sentence-transformers model directory (Transformer, Pooling in the encoder's mode and
``include_prompt``, Dense for the projection, Normalize when the model normalises; the modules are built
in :mod:`~composer_dynsample.export.sentence_modules`) that ``SentenceTransformer(out_dir)`` loads and
that embeds texts as the encoder does. Its model card, ``README.md``
(:func:`~composer_dynsample.export.model_card.model_card`), says the pooling, normalisation and
``max_seq_length`` (a folder's unless the config chose otherwise) and, given the run's config and metrics
(:func:`~composer_dynsample.export.model_card.run_metrics`), the training data (file names and SHA-256, no
local directories), the recipe and the scores. A ``TwoTowerEncoder`` of two transformers is written as one
``Router``: ``encode_query`` embeds as its query tower, ``encode_document`` (and ``encode``) as its
passage tower.

The folder is written whole or not at all (:mod:`~composer_dynsample.export.staging`).
``sentence-transformers`` is imported when the function runs.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from torch import nn

from composer_dynsample.export.huggingface import encoder_tokenizer, export_huggingface
from composer_dynsample.export.model_card import model_card, unwrap_encoder
from composer_dynsample.export.sentence_modules import (
    router_class,
    router_module,
    sentence_transformers_modules,
    sentence_transformers_steps,
)
from composer_dynsample.export.staging import new_file_modes, staged
from composer_dynsample.export.tokenizer import tower_tokenizer
from composer_dynsample.models.auto_model import quiet_transformers
from composer_dynsample.models.text import TransformerEncoder, TwoTowerEncoder, import_text_extra

__all__ = ["export_sentence_transformers"]


def export_sentence_transformers(
    model: nn.Module,
    tokenizer: Any,
    out_dir: str | os.PathLike[str],
    *,
    normalize: bool | None = None,
    special_tokens: Mapping[str, str] | None = None,
    max_length: int | None = None,
    config: Mapping[str, Any] | None = None,
    metrics: Mapping[str, Any] | None = None,
    prompts: Mapping[str, str] | None = None,
    default_prompt_name: str | None = None,
    passage_tokenizer: Any = None,
) -> Path:
    """Write a transformer encoder (or two towers) as a sentence-transformers model directory, with a card.

    The modules are the encoder's own steps: ``Transformer`` (the ``AutoModel`` and the tokenizer),
    ``Pooling`` in the encoder's mode (any of sentence-transformers', several concatenated in the
    encoder's order) and ``include_prompt``, written as the installed sentence-transformers names them
    (``pooling_mode`` and ``include_prompt`` in ``1_Pooling/config.json``; the ``pooling_mode_*`` flags
    before 6.0), ``Dense`` with the projection's weights and
    an identity activation (when the encoder projects), and ``Normalize`` when the embeddings are
    L2-normalised: ``SentenceTransformer(out_dir).encode(texts)`` embeds as the encoder does. The pooler
    the encoder dropped (BERT's, unused by the pooling) is written back, as :func:`export_huggingface`
    writes it. ``README.md`` is :func:`model_card`'s.

    A :class:`TwoTowerEncoder` of two transformers is written as sentence-transformers' ``Router``: a
    ``query`` route of the query tower's steps and a ``document`` route of the passage tower's (a frozen
    passage tower with its weights, as it was trained: unchanged), each tower's ``Transformer`` in a
    subfolder of its own holding the run's tokenizer. ``SentenceTransformer(out_dir).encode_query(texts)``
    embeds as the query tower does, ``encode_document(texts)`` (and ``encode``) as the passage tower.

    Args:
        model (torch.nn.Module): A :class:`TransformerEncoder`, a :class:`TwoTowerEncoder` of two, or an
            ``EmbeddingModel`` around either.
        tokenizer: The tokenizer the encoder was trained with (see :func:`pretrained_tokenizer`).
        passage_tokenizer: Two towers of two tokenizers: the passage tower's, which its ``document`` route
            holds. Default: ``None`` (``tokenizer`` for both).
        out_dir (str | os.PathLike): A new or empty directory.
        normalize (bool, optional): Add ``Normalize``. Default: ``None``, the ``EmbeddingModel``'s
            ``normalize``, or ``True`` (``EmbeddingModel``'s default) for a bare encoder.
        special_tokens (Mapping[str, str], optional): See :func:`pretrained_tokenizer`. Default: ``None``.
        max_length (int, optional): See :func:`export_huggingface` (sentence-transformers' ``max_seq_length``).
        config (Mapping[str, Any], optional): The run's config, for the model card.
        metrics (Mapping[str, Any], optional): The run's ``metrics.json``, for the model card.
        prompts (Mapping[str, str], optional): The prompts by name, written to
            ``config_sentence_transformers.json`` (``encode(texts, prompt_name=...)`` reads them). Default:
            ``None`` (none).
        default_prompt_name (str, optional): The prompt ``encode`` puts before texts given none; one of
            ``prompts``. Default: ``None``.

    Returns:
        Path: ``out_dir``.

    Raises:
        ValueError: If the encoder is not a :class:`TransformerEncoder` (the format holds a transformer)
            or two towers of them (with a sentence-transformers that has ``Router``), it concatenates
            several modes in an order a sentence-transformers before 6.0 cannot write, or as
            :func:`export_huggingface`.
    """
    encoder, normalized = unwrap_encoder(model, normalize)
    card = {"max_length": max_length, "normalize": normalized, "config": config, "metrics": metrics}
    towers = _transformer_towers(encoder)
    library = import_text_extra("sentence_transformers", "export_sentence_transformers")
    modules = sentence_transformers_modules()
    tokenizers = {route: tower_tokenizer(route, tokenizer, passage_tokenizer) for route, _ in towers}
    for route, tower in towers:  # checked before out_dir is created
        encoder_tokenizer(tower, tokenizers[route], special_tokens, max_length)
    if len(towers) > 1:
        router_class(modules)  # a sentence-transformers without Router: refused before out_dir is made
    with staged(out_dir) as directory, tempfile.TemporaryDirectory() as staging:
        routes = {}
        for route, tower in towers:
            tower_dir = Path(staging) / route
            export_huggingface(
                tower, tokenizers[route], tower_dir, special_tokens=special_tokens, max_length=max_length
            )
            routes[route] = sentence_transformers_steps(modules, tower, tower_dir, normalized)
        if "model" in routes:
            steps = routes["model"]
        else:
            steps = [router_module(modules, routes["query"], routes["document"])]
        with quiet_transformers():
            saved = library.SentenceTransformer(
                modules=steps,
                device="cpu",
                prompts=dict(prompts or {}),
                default_prompt_name=default_prompt_name,
            )
            saved.save(str(directory), create_model_card=False)
        title = Path(out_dir).expanduser().name
        (directory / "README.md").write_text(model_card(model, title=title, **card), encoding="utf-8")
        new_file_modes(directory)
    return Path(out_dir).expanduser()


def _transformer_towers(encoder: nn.Module) -> list[tuple[str, TransformerEncoder]]:
    """``[("model", encoder)]`` of a transformer, ``[("query", ...), ("document", ...)]`` of two towers of
    transformers: the sentence-transformers routes, each a transformer.

    Raises:
        ValueError: If the encoder is neither.
    """
    if isinstance(encoder, TransformerEncoder):
        return [("model", encoder)]
    if isinstance(encoder, TwoTowerEncoder):
        towers = [("query", encoder.query_encoder), ("document", encoder.passage_encoder)]
        if all(isinstance(tower, TransformerEncoder) for _, tower in towers):
            return towers
        got = f"a TwoTowerEncoder of {type(towers[0][1]).__name__} and {type(towers[1][1]).__name__}"
    else:
        got = type(encoder).__name__
    raise ValueError(
        f"export_sentence_transformers needs a TransformerEncoder (the format holds a Hugging Face "
        f"transformer) or a TwoTowerEncoder of two, got {got}; export_huggingface writes its state dict and "
        "config."
    )
