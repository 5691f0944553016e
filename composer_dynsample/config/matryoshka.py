"""Matryoshka embeddings in a config: the loss wrapped at several dimensions, and the metrics at each.

``model.loss.matryoshka_dims: [384, 256, 128, 64]`` (and optionally ``model.loss.matryoshka_weights``, one
weight per dimension, default 1 each) wraps whatever ``model.loss`` names in
:class:`~composer_dynsample.losses.MatryoshkaLoss`; the section's other keys are the inner loss's, checked
against its signature as before (:func:`split_loss_section` takes the two keys off first).

The evaluation (``train``'s final one, ``evaluation.at_start``'s and ``eval``'s) then also scores the
embeddings truncated to each smaller dimension and L2-normalised again (:func:`truncated_scores`),
under ``"matryoshka": {"256": {...}, "128": {...}, "64": {...}}`` with the names of the full-width
metrics. ``evaluation.matryoshka_dims`` asks for those dimensions without training with them (a plain
run's 64-dimension MRR, to compare with a Matryoshka run's); it takes precedence over the loss's
(:func:`evaluation_dims`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from composer_dynsample.config.components import ConfigError
from composer_dynsample.config.loading import evaluation_config, section

if TYPE_CHECKING:
    import torch
    from omegaconf import DictConfig

__all__ = [
    "MATRYOSHKA_KEYS",
    "RESULTS_KEY",
    "check_dims_fit",
    "evaluation_dims",
    "loss_dims",
    "split_loss_section",
    "truncated_scores",
    "wrap_loss",
]

#: The keys of ``model.loss`` that wrap the loss, not arguments of it.
MATRYOSHKA_KEYS = ("matryoshka_dims", "matryoshka_weights")
#: Where :func:`truncated_scores` puts its metrics in the results.
RESULTS_KEY = "matryoshka"


def split_loss_section(
    values: Mapping[str, Any],
) -> tuple[dict[str, Any], tuple[int, ...] | None, tuple[float, ...] | None]:
    """A ``model.loss`` section without the Matryoshka keys, and those keys checked: ``(inner, dims, weights)``.

    Raises:
        ConfigError: If ``matryoshka_dims`` is not a strictly descending list of integers >= 1, or
            ``matryoshka_weights`` comes without it or is not one number > 0 per dimension.
    """
    inner = dict(values)
    dims, weights = (inner.pop(key, None) for key in MATRYOSHKA_KEYS)
    if dims is None:
        if weights is not None:
            raise ConfigError(
                "model.loss.matryoshka_weights needs model.loss.matryoshka_dims, e.g. [384, 256, 128, 64]."
            )
        return inner, None, None
    from composer_dynsample.losses.matryoshka import check_matryoshka_dims, check_matryoshka_weights

    try:
        checked = check_matryoshka_dims(dims, "model.loss.matryoshka_dims")
        return inner, checked, check_matryoshka_weights(weights, checked)
    except ValueError as error:
        message = str(error)
        raise ConfigError(message if message.startswith("model.") else f"model.loss.{message}") from None


def loss_dims(cfg: DictConfig | Mapping[str, Any]) -> tuple[int, ...] | None:
    """``model.loss.matryoshka_dims`` of a config, checked, or ``None``."""
    loss = section(section(cfg, "model", "model"), "loss", "model.loss")
    return split_loss_section(loss)[1]


def wrap_loss(loss: torch.nn.Module, cfg: DictConfig | Mapping[str, Any]) -> torch.nn.Module:
    """``loss`` in a :class:`~composer_dynsample.losses.MatryoshkaLoss` when ``model.loss`` has
    ``matryoshka_dims``, else ``loss`` itself."""
    loss_section = section(section(cfg, "model", "model"), "loss", "model.loss")
    _, dims, weights = split_loss_section(loss_section)
    if dims is None:
        return loss
    from composer_dynsample.losses.matryoshka import MatryoshkaLoss

    return MatryoshkaLoss(loss, dims, weights)


def evaluation_dims(cfg: DictConfig) -> tuple[int, ...]:
    """The dimensions the evaluation also reports: ``evaluation.matryoshka_dims``, else
    ``model.loss.matryoshka_dims``, else none (``()``)."""
    asked = evaluation_config(cfg).matryoshka_dims
    if asked is not None:
        return tuple(asked)
    return loss_dims(cfg) or ()


def check_dims_fit(cfg: DictConfig, model: Any) -> None:
    """Refuse Matryoshka dimensions wider than the built model's embeddings, before any step or evaluation.

    The width is the encoder's ``embedding_dim`` (every encoder of this package has one); a model whose
    encoder does not say is checked at its first step and evaluation instead.

    Args:
        cfg (DictConfig): The config (``model.loss.matryoshka_dims``, ``evaluation.matryoshka_dims``).
        model: The built model (an ``EmbeddingModel``).

    Raises:
        ConfigError: Naming the key, the dimension and the width (one line).
    """
    from composer_dynsample.validation import is_int

    width = getattr(getattr(model, "encoder", None), "embedding_dim", None)
    if not is_int(width):
        return
    asked = evaluation_config(cfg).matryoshka_dims
    for key, dims in (("model.loss.matryoshka_dims", loss_dims(cfg)), ("evaluation.matryoshka_dims", asked)):
        wider = [dim for dim in dims or () if dim > width]
        if wider:
            example = [width, *([width // 2] if width >= 2 else [])]
            raise ConfigError(
                f"{key}: {wider[0]} is wider than the {width} dimensions of the model's embeddings; use "
                f"dimensions of at most {width}, e.g. {example}."
            )


def truncated_scores(
    score: Callable[[torch.Tensor, torch.Tensor | None], dict[str, float]],
    queries: torch.Tensor,
    gallery: torch.Tensor | None,
    dims: Sequence[int],
) -> dict[str, dict[str, float]]:
    """``score(queries, gallery)`` on the first ``d`` dimensions of both, L2-normalised again, for each ``d``
    of ``dims`` narrower than the embeddings: ``{str(d): metrics}`` (the full width is the caller's result).

    Args:
        score: The metrics of query and gallery embeddings (the gallery ``None`` for leave-one-out).
        queries (torch.Tensor): ``(Q, D)`` the query embeddings.
        gallery (torch.Tensor, optional): ``(G, D)`` the gallery's, or ``None``.
        dims (Sequence[int]): The dimensions.

    Raises:
        ConfigError: If a dimension is wider than ``D``.
    """
    from composer_dynsample.losses.matryoshka import truncated

    width = queries.shape[-1]
    wider = [dim for dim in dims if dim > width]
    if wider:
        raise ConfigError(
            f"matryoshka_dims: {wider[0]} is wider than the {width} dimensions of the model's embeddings; "
            "use dimensions of at most that (evaluation.matryoshka_dims, else model.loss.matryoshka_dims)."
        )
    return {
        str(dim): score(truncated(queries, dim), None if gallery is None else truncated(gallery, dim))
        for dim in dims
        if dim < width
    }
