"""The sentence-transformers modules of a trained text encoder, for its export as a sentence-transformers model.

A :class:`~composer_dynsample.models.text.TransformerEncoder` is a list of sentence-transformers' steps
(:func:`sentence_transformers_steps`): ``Transformer`` (the model and tokenizer its export wrote),
``Pooling`` in its modes and ``include_prompt`` (:func:`pooling_module`), ``Dense`` for its projection and
``Normalize`` when the model normalises. A :class:`~composer_dynsample.models.text.TwoTowerEncoder` of two
such encoders is one ``Router`` (:func:`router_module`): a ``query`` route of the query tower's steps and
a ``document`` route of the passage tower's, which ``encode_query`` and ``encode_document`` take (plain
``encode`` takes the ``document`` route). The module classes are those of the installed
sentence-transformers (:func:`sentence_transformers_modules`); ``Router`` came with 5.0.

They are built here and written by
:func:`~composer_dynsample.export.sentence_transformers.export_sentence_transformers`;
``sentence-transformers`` is imported only when a function runs.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

from torch import nn

from composer_dynsample.models.auto_model import quiet_transformers
from composer_dynsample.models.sentence_folder import POOLING_FLAGS
from composer_dynsample.models.transformer import TransformerEncoder

__all__ = [
    "pooling_module",
    "router_class",
    "router_module",
    "sentence_transformers_modules",
    "sentence_transformers_steps",
]


def sentence_transformers_modules() -> Any:
    """sentence-transformers' module classes: ``sentence_transformer.modules`` from 6.0, else ``models``."""
    try:
        from sentence_transformers.sentence_transformer import modules
    except ImportError:
        from sentence_transformers import models as modules
    return modules


def sentence_transformers_steps(
    modules: Any, encoder: TransformerEncoder, staged: Path, normalized: bool
) -> list[nn.Module]:
    """The modules of the encoder's steps: Transformer (of ``staged``, the encoder's Hugging Face export),
    Pooling, Dense (when it projects) and Normalize (when ``normalized``)."""
    with quiet_transformers():
        transformer = modules.Transformer(str(staged))
    steps: list[nn.Module] = [transformer, pooling_module(modules, encoder)]
    if encoder.projection is not None:
        dense = modules.Dense(
            encoder.projection.in_features,
            encoder.projection.out_features,
            bias=True,
            activation_function=nn.Identity(),
        )
        dense.linear.load_state_dict(encoder.projection.state_dict())
        steps.append(dense)
    if normalized:
        steps.append(modules.Normalize())
    return steps


def pooling_module(modules: Any, encoder: TransformerEncoder) -> nn.Module:
    """sentence-transformers' ``Pooling`` in the encoder's modes and ``include_prompt``: ``pooling_mode``
    (one mode, or the modes in their order) from 6.0, the ``pooling_mode_*`` flags before.

    Raises:
        ValueError: If the encoder concatenates several modes in an order other than the flags' before 6.0.
    """
    modes = tuple(encoder.pooling.split("+"))
    dimension, include_prompt = encoder.model.config.hidden_size, encoder.include_prompt
    if "pooling_mode_cls_token" not in inspect.signature(modules.Pooling).parameters:
        mode = modes[0] if len(modes) == 1 else modes
        return modules.Pooling(dimension, pooling_mode=mode, include_prompt=include_prompt)
    flags = {flag: name in modes for flag, name in POOLING_FLAGS.items()}
    if len(modes) > 1 and list(modes) != [name for name in POOLING_FLAGS.values() if name in modes]:
        raise ValueError(
            f"pooling {encoder.pooling!r}: sentence-transformers before 6.0 concatenates the modes in the "
            f"order {list(POOLING_FLAGS.values())}; install sentence-transformers 6 to export this order."
        )
    return modules.Pooling(dimension, **flags, include_prompt=include_prompt)


def router_module(modules: Any, query_steps: list[nn.Module], document_steps: list[nn.Module]) -> nn.Module:
    """A ``Router`` of a ``query`` route (``query_steps``) and a ``document`` route (``document_steps``, also
    the default route of a plain ``encode``).

    Raises:
        ValueError: As :func:`router_class`.
    """
    return router_class(modules).for_query_document(
        query_modules=query_steps, document_modules=document_steps
    )


def router_class(modules: Any) -> type[nn.Module]:
    """sentence-transformers' ``Router`` class of ``modules`` (:func:`sentence_transformers_modules`).

    Raises:
        ValueError: If the installed sentence-transformers has none (before 5.0).
    """
    router = getattr(modules, "Router", None)
    if router is None:
        raise ValueError(
            "a two-tower model is written as sentence-transformers' Router, which this sentence-transformers "
            "lacks; install sentence-transformers 5 or newer, or export --format huggingface."
        )
    return router
