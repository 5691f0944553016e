"""The Hugging Face ``transformers`` encoder: token ids and an attention mask to ``(B, embedding_dim)``.

:class:`TransformerEncoder` wraps any ``AutoModel``, from a local directory or from a config (random
init), with any pooling of sentence-transformers (:mod:`~composer_dynsample.models.pooling`) and an
optional projection. A sentence-transformers folder gives its pooling (its ``Pooling`` module's mode and
``include_prompt``) unless one is given; its model may sit in a subfolder
(``0_Transformer``), as :mod:`~composer_dynsample.models.sentence_folder` reads it. It reads the same
features as the other text encoders (see :mod:`composer_dynsample.models.text`); ``transformers`` is
imported only when one is built. It is importable from :mod:`composer_dynsample.models.text` too.

:func:`position_limit` (of :mod:`~composer_dynsample.models.positions`, importable from here too) reads
how long a text such a model takes off its config, without building it (the config checks compare it
with the data's ``max_length``); :func:`folder_pooling` is the pooling a folder gives, or a one-line
error for a mode nobody knows. Loading or building the ``AutoModel`` itself is
:mod:`~composer_dynsample.models.auto_model`'s, whose :func:`quiet_transformers` (keeping ``transformers``'
load reports and progress bars out of the output) is importable from here too.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from composer_dynsample.models.auto_model import _from_config, _load_pretrained, quiet_transformers
from composer_dynsample.models.pooling import POOLING_MODES, pool_tokens, pooling_modes, prompt_lengths
from composer_dynsample.models.positions import (
    PADDING_OFFSET_MODEL_TYPES,
    PositionLimit,
    position_limit,
    token_positions,
)
from composer_dynsample.models.sentence_folder import ModelFolder, read_model_folder
from composer_dynsample.models.tokens import (
    _positive,
    _projection,
    length_groups,
    range_checked_after,
    token_inputs,
)
from composer_dynsample.validation import InputTypeError, check_bool, check_int

__all__ = [
    "PADDING_OFFSET_MODEL_TYPES",
    "TRANSFORMER_POOLINGS",
    "PositionLimit",
    "TransformerEncoder",
    "folder_pooling",
    "position_limit",
    "quiet_transformers",
]

TRANSFORMER_POOLINGS = POOLING_MODES  # each mode; several join with "+"


class TransformerEncoder(nn.Module):
    """A Hugging Face ``transformers`` encoder (``AutoModel``) with sentence-transformers' pooling.

    Built from a local model directory (``path``: ``from_pretrained`` with ``local_files_only``; never a
    download; of a sentence-transformers folder, its ``Transformer`` module's, at its root or in a
    subfolder such as ``0_Transformer``) or from a config (``config``: ``{"model_type": "bert",
    "hidden_size": ..., ...}``, random init through ``AutoConfig.for_model``). The model's own pooler
    (BERT's ``pooler``, unused by the pooling of the hidden states) is removed, so that every parameter
    takes part in the loss, as DDP requires. The last hidden states are pooled over ``attention_mask`` as
    sentence-transformers' ``Pooling`` pools them (:func:`~composer_dynsample.models.pooling.pool_tokens`):
    ``"mean"``, ``"cls"``, ``"max"``, ``"mean_sqrt_len_tokens"``, ``"weightedmean"``, ``"lasttoken"`` (the
    last attended token, right- or left-padded), or several joined by ``+``, concatenated. An optional
    linear projection maps them to ``embedding_dim``.

    The features may hold ``prompt_length``, a ``(B,)`` integer tensor: each row's prompt positions
    counted from its first attended one, the leading special token (``[CLS]``) included, as
    sentence-transformers counts them (the prompt tokenized alone, less its trailing ``[SEP]``). With
    ``include_prompt=False`` those positions are left out of the pooling; without it, or absent, every
    token is pooled.
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
        pooling (str, optional): A mode of :data:`TRANSFORMER_POOLINGS` or several joined by ``+``
            (``"mean+max"``). Default: ``None``: the mode of the ``Pooling`` module of a
            sentence-transformers ``path`` (its ``1_Pooling/config.json``), else ``"mean"``.
        include_prompt (bool, optional): Pool a prompt's tokens with the text's; ``False`` leaves out
            each row's first ``prompt_length`` tokens. Default: ``None``: the folder's ``include_prompt``,
            else ``True``.
        embedding_dim (int, optional): Project to this dimension. Default: ``None``, the hidden size.
        trim_padding (bool): Run a batch's shorter and longer rows as two groups, each cut to its own
            longest row, when that saves a quarter of the positions or more
            (:func:`~composer_dynsample.models.tokens.length_groups`): a batch of short queries and long
            passages no longer runs the queries' padding through every layer. The embeddings are those of
            the whole batch (the padding is masked out either way) up to float rounding. Default: ``True``.
        pad_to_multiple_of (int, optional): With ``trim_padding``, cut each group to its longest row
            rounded up to a multiple of this (never past the batch's width), so that the groups keep the
            shapes a GPU's tensor cores take whole (8) as the collate's padding does. Default: ``None``
            (each group's longest row; a config run on a CUDA device fills 8).
        attn_implementation (str): The attention kernel ``transformers`` runs: ``"sdpa"``, PyTorch's
            fused ``scaled_dot_product_attention`` (flash or memory-efficient kernels on a GPU), for a model
            type that has it, else ``"eager"`` (no error: MPNet, DeBERTa...); ``"eager"`` or another
            ``transformers`` implementation is used as given. An ``attn_implementation`` in ``config`` wins.
            Default: ``"sdpa"`` (also ``transformers``' own default where the model has it).
        compile (bool | Mapping[str, Any]): ``torch.compile`` the ``transformers`` model in place
            (``nn.Module.compile``: its parameter names, checkpoints and exports do not change), with these
            ``torch.compile`` arguments (``mode``, ``dynamic``, ``backend``, ``fullgraph``, ``options``) when a
            mapping; the checks and pooling around it stay eager. The first steps pay the compilation.
            Default: ``False``.

    Attributes:
        max_tokens (int | None): The longest text, in tokens (special tokens included), the model has
            position embeddings for (see :func:`position_limit`); ``None`` when it does not say.
        folder (ModelFolder | None): What ``path`` says of its model (pooling, normalisation, length),
            read by :func:`~composer_dynsample.models.sentence_folder.read_model_folder`; ``None`` with
            ``config``.
        attn_implementation (str): The attention implementation the model runs (``"sdpa"``, ``"eager"``...).

    Loading from ``path`` prints no report of ``transformers``: a line says what of the folder's weights
    was not loaded (its pooler, heads of other tasks), and a ``UserWarning`` names weights the folder
    lacks (randomly initialised) and modules of a sentence-transformers folder the encoder does not
    build (a ``Dense`` after the pooling).

    Raises:
        ValueError: If ``path`` is not a local model directory, ``pooling`` (or the folder's, when it is
            not given) names an unknown mode, ``config`` names an unknown model type or argument,
            ``vocab_size`` disagrees with the model, or an argument is out of range.

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
        pooling: str | None = None,
        include_prompt: bool | None = None,
        embedding_dim: int | None = None,
        trim_padding: bool = True,
        pad_to_multiple_of: int | None = None,
        attn_implementation: str = "sdpa",
        compile: bool | Mapping[str, Any] = False,
    ) -> None:
        super().__init__()
        self.trim_padding = check_bool("trim_padding", trim_padding)
        self.pad_to_multiple_of = check_int(
            "pad_to_multiple_of", pad_to_multiple_of, minimum=1, allow_none=True
        )
        if not isinstance(attn_implementation, str) or not attn_implementation:
            raise InputTypeError(
                "attn_implementation must be a transformers attention implementation such as 'sdpa' or "
                f"'eager', got {attn_implementation!r}."
            )
        compile_options = _compile_options(compile)
        self.folder = _read_folder(path) if path is not None and config is None else None
        if pooling is None:
            pooling = "mean" if self.folder is None else folder_pooling(self.folder)
        self._modes = pooling_modes(pooling)
        self.pooling = "+".join(self._modes)
        if include_prompt is None:
            include_prompt = True if self.folder is None else self.folder.include_prompt
        self.include_prompt = check_bool("include_prompt", include_prompt)
        if vocab_size is not None:
            vocab_size = _positive("vocab_size", vocab_size)
        if (path is None) == (config is None):
            given = "both" if path is not None else "neither"
            raise ValueError(
                "TransformerEncoder needs exactly one of path (a local model directory) and config "
                f"(a model_type and its sizes), got {given}."
            )
        model = (
            _load_pretrained(path, self.folder, attn_implementation)
            if self.folder is not None
            else _from_config(config, vocab_size, attn_implementation)
        )
        self.attn_implementation = str(getattr(model.config, "_attn_implementation", None) or "eager")
        self.max_tokens = token_positions(model.config.to_dict())
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
        if compile_options is not None:
            model.compile(**compile_options)  # in place: the state dict keeps its keys
        pooled_size = model.config.hidden_size * len(self._modes)  # the modes concatenated
        self.projection, self.embedding_dim = _projection(pooled_size, embedding_dim)
        self.arguments = {
            "vocab_size": self.vocab_size,
            "pooling": self.pooling,
            "include_prompt": self.include_prompt,
            "embedding_dim": embedding_dim,
        }

    def forward(self, features: Any) -> torch.Tensor:
        """Embed the text features (see the module docstring) to ``(B, embedding_dim)``.

        ``features["prompt_length"]`` (a ``(B,)`` integer tensor, optional) is each row's prompt positions,
        left out of the pooling when :attr:`include_prompt` is false (see the class docstring).

        Raises:
            ValueError: If the features are malformed (``prompt_length`` included), an id is outside the
                vocabulary, or the texts are longer than the model has positions for (:attr:`max_tokens`).
        """
        checked = getattr(self, "_range_checked", False)
        ids, mask = token_inputs(features, type(self).__name__, self.vocab_size, check_range=not checked)
        prompt = prompt_lengths(features, ids.shape[0], type(self).__name__)
        prompt = None if self.include_prompt else prompt
        self._range_checked = range_checked_after(ids)
        if self.max_tokens is not None and ids.shape[-1] > self.max_tokens:
            raise ValueError(
                f"{type(self).__name__}: the texts are {ids.shape[-1]} tokens long but the model has positions "
                f"for {self.max_tokens} (max_position_embeddings {self.model.config.max_position_embeddings}); "
                f"truncate them to at most {self.max_tokens} tokens (the data's max_length)."
            )
        extra = {}
        if isinstance(features, Mapping) and "token_type_ids" in features:
            extra["token_type_ids"] = features["token_type_ids"]
        groups = length_groups(mask) if self.trim_padding else None
        if groups is None:
            pooled = self._pooled(ids, mask, extra, prompt)
        else:  # short and long rows apart, each group cut to its own longest row
            parts = []
            for rows, longest in groups:
                width = self._group_width(longest, ids.shape[-1])
                cut = {key: value[rows, :width] for key, value in extra.items()}
                rows_prompt = None if prompt is None else prompt[rows.to(prompt.device)]
                parts.append(self._pooled(ids[rows, :width], mask[rows, :width], cut, rows_prompt))
            order = torch.cat([rows for rows, _ in groups])
            inverse = torch.empty_like(order)
            inverse[order] = torch.arange(len(order), device=order.device)
            pooled = torch.cat(parts)[inverse]
        return pooled if self.projection is None else self.projection(pooled)

    def _group_width(self, longest: int, width: int) -> int:
        """A group's width: its ``longest`` row, rounded up to :attr:`pad_to_multiple_of`, at most ``width``."""
        multiple = self.pad_to_multiple_of
        return longest if multiple is None else min(width, -(-longest // multiple) * multiple)

    def _pooled(
        self,
        ids: torch.Tensor,
        mask: torch.Tensor,
        extra: dict[str, torch.Tensor],
        prompt: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The model's pooled last hidden states of ``ids`` (``(B, hidden * modes)``), ``prompt`` (each
        row's prompt positions) left out."""
        outputs = self.model(input_ids=ids, attention_mask=mask, **extra)
        hidden = outputs.last_hidden_state if hasattr(outputs, "last_hidden_state") else outputs[0]
        return pool_tokens(hidden, mask, self._modes, prompt_length=prompt)


def _read_folder(path: Any) -> ModelFolder:
    """What the folder ``path`` says (see :mod:`~composer_dynsample.models.sentence_folder`).

    Raises:
        InputTypeError: If ``path`` is not a string or path.
        ValueError: If its ``modules.json`` or a module's settings cannot be read.
    """
    if not isinstance(path, (str, os.PathLike)):
        raise InputTypeError(f"path must be a local directory (a string), got {type(path).__name__}.")
    return read_model_folder(path)


def folder_pooling(folder: ModelFolder, key: str = "pooling", path_key: str = "path") -> str:
    """The pooling of ``folder`` for a :class:`TransformerEncoder`: its ``Pooling`` module's, else mean.

    Args:
        folder (ModelFolder): What the model folder says.
        key (str): The key the error names for choosing the pooling (``"model.encoder.pooling"`` in a
            config). Default: ``"pooling"``.
        path_key (str): The key the error names for the folder. Default: ``"path"``.

    Returns:
        str: A mode of :data:`TRANSFORMER_POOLINGS`, or several joined by ``+`` (``"mean+max"``).

    Raises:
        ValueError: If the folder names a mode sentence-transformers does not have.
    """
    if folder.pooling is None:
        return "mean"
    with contextlib.suppress(ValueError):
        return "+".join(pooling_modes(folder.pooling))
    where = folder.pooling_file.relative_to(folder.path) if folder.pooling_file is not None else "?"
    raise ValueError(
        f"{path_key} {str(folder.path)!r} pools by {folder.pooling!r} ({where}), a mode TransformerEncoder "
        f"does not know; set {key} to one of {POOLING_MODES} (or several joined by '+')."
    )


def _compile_options(value: Any) -> dict[str, Any] | None:
    """``torch.compile``'s keyword arguments of ``compile`` (``None``: not compiled).

    Raises:
        InputTypeError: If ``compile`` is neither a bool nor a mapping.
        ValueError: If the mapping names an argument ``torch.compile`` does not take.
    """
    if isinstance(value, bool):
        return {} if value else None
    if not isinstance(value, Mapping):
        raise InputTypeError(
            f"compile must be true, false or a mapping of torch.compile arguments, got {value!r}."
        )
    valid = ("fullgraph", "dynamic", "backend", "mode", "options", "disable")
    unknown = sorted(str(key) for key in value if key not in valid)
    if unknown:
        raise ValueError(f"compile: torch.compile takes no argument {unknown[0]!r}; valid: {list(valid)}.")
    return dict(value)
