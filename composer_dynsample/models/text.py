"""Text encoders: token ids and an attention mask to ``(B, embedding_dim)`` embeddings.

* :class:`TransformerEncoder`: any Hugging Face ``transformers`` encoder (``AutoModel``), from a local
  directory or from a config (random init), with mean or CLS pooling and an optional projection.
* :class:`BagOfTokensEncoder`: CodeSearchNet's neural bag of words: token embeddings, masked mean,
  max or weighted-mean pooling, an optional projection. Fast on a CPU.
* :class:`TextCNNEncoder`: a 1-D CNN over token embeddings with masked max pooling.
* :class:`TwoTowerEncoder`: separate encoders for queries and passages, routed by ``is_query``.

Every encoder reads the text collate's features, a mapping ``{"input_ids": (B, L) int64,
"attention_mask": (B, L), "is_query": (B,) bool}`` (a bare ``(B, L)`` tensor of ids counts as unpadded).
Padding positions (``attention_mask == 0``) never change an embedding, whatever their ids, so the same
text padded to any length embeds the same. ``vocab_size`` is the tokenizer's, read off the data; an id
outside ``[0, vocab_size)`` raises an error naming it instead of an index error deep in the model.
``transformers`` is imported only when a :class:`TransformerEncoder` is built.
"""

from __future__ import annotations

import difflib
import importlib
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from composer_dynsample.validation import (
    InputTypeError,
    check_choice,
    check_float,
    check_int,
    describe,
    is_int,
)

__all__ = [
    "BAG_POOLINGS",
    "TRANSFORMER_POOLINGS",
    "BagOfTokensEncoder",
    "TextCNNEncoder",
    "TransformerEncoder",
    "TwoTowerEncoder",
    "import_text_extra",
    "masked_max_pool",
    "masked_mean_pool",
    "token_inputs",
]

TRANSFORMER_POOLINGS = ("mean", "cls")
BAG_POOLINGS = ("mean", "max", "weighted_mean")
_ACTIVATIONS: dict[str, type[nn.Module]] = {"relu": nn.ReLU, "gelu": nn.GELU, "silu": nn.SiLU}


def import_text_extra(module: str, needed_by: str) -> Any:
    """Import ``module`` of the ``[text]`` extra, or raise a one-line ``ImportError`` saying how to install it.

    Example:
        >>> import_text_extra("tokenizers", "a test").__name__
        'tokenizers'
    """
    try:
        return importlib.import_module(module)
    except ImportError:
        raise ImportError(
            f"{needed_by} needs {module.split('.')[0]}, part of the [text] extra: "
            "pip install 'composer-dynsample[text]'."
        ) from None


def token_inputs(features: Any, owner: str, vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Check and return ``(input_ids, attention_mask)`` from text features.

    Args:
        features: A mapping with ``input_ids`` and (optionally) ``attention_mask``, or a ``(B, L)`` tensor
            of ids (then every position is a token).
        owner (str): The encoder's name, for the error messages.
        vocab_size (int): Ids must lie in ``[0, vocab_size)``.

    Returns:
        The ``(B, L)`` ids and the ``(B, L)`` mask, as given (the mask is all ones when absent).

    Raises:
        InputTypeError: If the ids or the mask are not integer (or bool) tensors of one shape.
        ValueError: If an id lies outside ``[0, vocab_size)``.

    Example:
        >>> ids, mask = token_inputs({"input_ids": torch.tensor([[2, 5, 0]])}, "Encoder", 10)
        >>> mask.tolist()
        [[1, 1, 1]]
        >>> token_inputs(torch.tensor([[2, 12]]), "Encoder", 10)
        Traceback (most recent call last):
            ...
        ValueError: Encoder: input_ids hold token id 12 but vocab_size is 10; build the encoder with the tokenizer's vocab_size (the data's).
    """
    if isinstance(features, Mapping):
        if "input_ids" not in features:
            raise InputTypeError(f"{owner}: the features have keys {sorted(features)}, missing 'input_ids'.")
        ids, mask = features["input_ids"], features.get("attention_mask")
    else:
        ids, mask = features, None
    if not _integer_tensor(ids) or ids.ndim != 2:
        raise InputTypeError(f"{owner}: input_ids must be a (B, L) integer tensor, got {describe(ids)}.")
    if mask is None:
        mask = torch.ones_like(ids)
    elif not (_integer_tensor(mask) or mask.dtype == torch.bool) or mask.shape != ids.shape:
        raise InputTypeError(
            f"{owner}: attention_mask must be an integer or bool tensor of the ids' shape "
            f"{tuple(ids.shape)}, got {describe(mask)}."
        )
    if ids.numel():
        low, high = (int(v) for v in torch.aminmax(ids))
        if low < 0 or high >= vocab_size:
            raise ValueError(
                f"{owner}: input_ids hold token id {low if low < 0 else high} but vocab_size is {vocab_size}; "
                "build the encoder with the tokenizer's vocab_size (the data's)."
            )
    return ids, mask


def _integer_tensor(value: object) -> bool:
    return (
        isinstance(value, torch.Tensor)
        and not value.is_floating_point()
        and not value.is_complex()
        and value.dtype != torch.bool
    )


def masked_mean_pool(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of ``hidden`` ``(B, L, D)`` over the positions where ``mask`` ``(B, L)`` is non-zero.

    Computed as sentence-transformers' ``Pooling(pooling_mode="mean")`` does, so an exported model embeds
    the same; a row without tokens gives zeros.

    Example:
        >>> hidden = torch.tensor([[[1.0], [3.0], [100.0]]])
        >>> masked_mean_pool(hidden, torch.tensor([[1, 1, 0]])).tolist()
        [[2.0]]
    """
    weights = mask.unsqueeze(-1).to(hidden.dtype)
    return (hidden * weights).sum(1) / weights.sum(1).clamp(min=1e-9)


def masked_max_pool(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Maximum of ``hidden`` ``(B, L, D)`` over the positions where ``mask`` is non-zero (zeros for none).

    Example:
        >>> hidden = torch.tensor([[[1.0], [3.0], [100.0]]])
        >>> masked_max_pool(hidden, torch.tensor([[1, 1, 0]])).tolist()
        [[3.0]]
    """
    present = mask.bool().unsqueeze(-1)
    pooled = hidden.masked_fill(~present, float("-inf")).amax(1)
    return torch.where(present.any(1), pooled, torch.zeros_like(pooled))


def _projection(in_features: int, embedding_dim: int | None) -> tuple[nn.Linear | None, int]:
    """The optional ``Linear(in_features, embedding_dim)`` and the encoder's output dimension."""
    if embedding_dim is None:
        return None, in_features
    dim = check_int("embedding_dim", embedding_dim, minimum=1)
    return nn.Linear(in_features, dim), dim  # type: ignore[arg-type]


def _positive(name: str, value: object) -> int:
    return check_int(name, value, minimum=1)  # type: ignore[return-value]


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


class _TokenEncoder(nn.Module):
    """What :class:`BagOfTokensEncoder` and :class:`TextCNNEncoder` share: the token table and the head."""

    def __init__(self, vocab_size: object, token_dim: object, dropout: object) -> None:
        super().__init__()
        self.vocab_size = _positive("vocab_size", vocab_size)
        self.token_dim = _positive("token_dim", token_dim)
        self.embedding = nn.Embedding(self.vocab_size, self.token_dim)
        rate = check_float("dropout", dropout, minimum=0, maximum=1, strict_maximum=True)
        self.dropout = nn.Dropout(rate)

    def _tokens(self, features: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """The masked token embeddings ``(B, L, token_dim)`` (padding zeroed) and the mask."""
        ids, mask = token_inputs(features, type(self).__name__, self.vocab_size)
        tokens = self.dropout(self.embedding(ids))
        return tokens * mask.unsqueeze(-1).to(tokens.dtype), mask


class BagOfTokensEncoder(_TokenEncoder):
    """A neural bag of words (CodeSearchNet's NBoW): token embeddings, pooled over the text's tokens.

    Pooling over the positions where ``attention_mask`` is set: ``"mean"``, ``"max"``, or
    ``"weighted_mean"`` (CodeSearchNet's: each token weighted by ``sigmoid(w . e + b)`` of its embedding
    ``e``, a learned relevance). An optional linear projection maps to ``embedding_dim``. Deterministic
    given the seed: ``torch.manual_seed`` fixes the initial weights, and the forward has no randomness
    unless ``dropout > 0`` (on the token embeddings, in training).

    Args:
        vocab_size (int): The tokenizer's vocabulary size (the data's).
        token_dim (int): Width of the token embeddings. Default: ``128``.
        pooling (str): ``"mean"``, ``"max"`` or ``"weighted_mean"``. Default: ``"mean"``.
        embedding_dim (int, optional): Project to this dimension. Default: ``None``, ``token_dim``.
        dropout (float): Dropout on the token embeddings, in ``[0, 1)``. Default: ``0.0``.

    Example:
        >>> encoder = BagOfTokensEncoder(vocab_size=100, token_dim=16, pooling="max", embedding_dim=8)
        >>> features = {"input_ids": torch.tensor([[5, 9, 0]]), "attention_mask": torch.tensor([[1, 1, 0]])}
        >>> encoder(features).shape
        torch.Size([1, 8])
    """

    def __init__(
        self,
        *,
        vocab_size: int,
        token_dim: int = 128,
        pooling: str = "mean",
        embedding_dim: int | None = None,
        dropout: float = 0.0,
    ) -> None:
        super().__init__(vocab_size, token_dim, dropout)
        self.pooling = check_choice("pooling", pooling, BAG_POOLINGS)
        self.token_weight = nn.Linear(self.token_dim, 1) if self.pooling == "weighted_mean" else None
        self.projection, self.embedding_dim = _projection(self.token_dim, embedding_dim)
        self.arguments = {
            "vocab_size": self.vocab_size,
            "token_dim": self.token_dim,
            "pooling": self.pooling,
            "embedding_dim": embedding_dim,
            "dropout": self.dropout.p,
        }

    def forward(self, features: Any) -> torch.Tensor:
        """Embed the text features (see the module docstring) to ``(B, embedding_dim)``."""
        tokens, mask = self._tokens(features)
        if self.pooling == "max":
            pooled = masked_max_pool(tokens, mask)
        elif self.token_weight is not None:
            weights = torch.sigmoid(self.token_weight(tokens)) * mask.unsqueeze(-1).to(tokens.dtype)
            pooled = (tokens * weights).sum(1) / weights.sum(1).clamp(min=1e-9)
        else:
            pooled = masked_mean_pool(tokens, mask)
        return pooled if self.projection is None else self.projection(pooled)


class TextCNNEncoder(_TokenEncoder):
    """A 1-D CNN over token embeddings (CodeSearchNet's 1D-CNN), max-pooled over the text's tokens.

    ``num_layers`` blocks of ``Conv1d(kernel_size, padding=kernel_size // 2)`` and the activation run over
    the token embeddings; padding positions are zeroed before every block, so they act as the
    convolution's own zero padding and the same text embeds the same at any padded length. The last
    block's channels are max-pooled over the tokens, then optionally projected to ``embedding_dim``.
    Deterministic given the seed, as :class:`BagOfTokensEncoder` is.

    Args:
        vocab_size (int): The tokenizer's vocabulary size (the data's).
        token_dim (int): Width of the token embeddings. Default: ``128``.
        channels (int | Sequence[int]): Output channels of every block, or one per block. Default: ``128``.
        num_layers (int): Number of conv blocks. Default: ``2``.
        kernel_size (int): Odd kernel size of every conv. Default: ``3``.
        activation (str): ``"relu"``, ``"gelu"`` or ``"silu"``. Default: ``"relu"``.
        embedding_dim (int, optional): Project to this dimension. Default: ``None``, the last channels.
        dropout (float): Dropout on the token embeddings, in ``[0, 1)``. Default: ``0.0``.

    Example:
        >>> encoder = TextCNNEncoder(vocab_size=100, token_dim=16, channels=12, embedding_dim=8)
        >>> encoder(torch.tensor([[5, 9, 3, 4]])).shape
        torch.Size([1, 8])
    """

    def __init__(
        self,
        *,
        vocab_size: int,
        token_dim: int = 128,
        channels: int | Sequence[int] = 128,
        num_layers: int = 2,
        kernel_size: int = 3,
        activation: str = "relu",
        embedding_dim: int | None = None,
        dropout: float = 0.0,
    ) -> None:
        super().__init__(vocab_size, token_dim, dropout)
        layers = _positive("num_layers", num_layers)
        widths = [channels] * layers if is_int(channels) else channels
        if isinstance(widths, (str, bytes)) or not isinstance(widths, Sequence) or len(widths) != layers:
            raise ValueError(
                f"channels must be an integer or a list of {layers} integers (one per layer), got {channels!r}."
            )
        widths = [_positive(f"channels[{i}]", width) for i, width in enumerate(widths)]
        self.kernel_size = _positive("kernel_size", kernel_size)
        if self.kernel_size % 2 == 0:
            raise ValueError(
                f"kernel_size must be odd (the padding keeps lengths aligned), got {kernel_size}."
            )
        act = _ACTIVATIONS[check_choice("activation", activation, _ACTIVATIONS)]
        self.convs = nn.ModuleList(
            nn.Conv1d(width_in, width, self.kernel_size, padding=self.kernel_size // 2)
            for width_in, width in zip([self.token_dim, *widths[:-1]], widths)
        )
        self.activation = act()
        self.projection, self.embedding_dim = _projection(widths[-1], embedding_dim)
        self.arguments = {
            "vocab_size": self.vocab_size,
            "token_dim": self.token_dim,
            "channels": widths,
            "num_layers": layers,
            "kernel_size": self.kernel_size,
            "activation": activation,
            "embedding_dim": embedding_dim,
            "dropout": self.dropout.p,
        }

    def forward(self, features: Any) -> torch.Tensor:
        """Embed the text features (see the module docstring) to ``(B, embedding_dim)``."""
        tokens, mask = self._tokens(features)
        keep = mask.unsqueeze(1)
        hidden = tokens.transpose(1, 2)
        for conv in self.convs:
            hidden = self.activation(conv(hidden))
            hidden = hidden * keep.to(hidden.dtype)  # padding stays zero, like the conv's own padding
        pooled = masked_max_pool(hidden.transpose(1, 2), mask)
        return pooled if self.projection is None else self.projection(pooled)


class TwoTowerEncoder(nn.Module):
    """Separate query and passage encoders: each row goes to the tower its ``is_query`` flag names.

    The rows keep their order in the output. ``is_query`` is a ``(B,)`` bool tensor in the features, so
    ``EmbeddingModel(forward_chunk_size=N)`` splits it with the rest. A tower with no row in the batch
    still joins the autograd graph with a zero gradient, so DDP (which expects a gradient for every
    parameter) does not stall on it. Both towers must produce embeddings of one dimension.

    Args:
        query_encoder (torch.nn.Module): Embeds the rows where ``is_query`` is true.
        passage_encoder (torch.nn.Module): Embeds the other rows.

    Example:
        >>> towers = TwoTowerEncoder(BagOfTokensEncoder(vocab_size=50, token_dim=8),
        ...                          BagOfTokensEncoder(vocab_size=50, token_dim=8))
        >>> features = {"input_ids": torch.tensor([[3, 4], [5, 6], [7, 8]]),
        ...             "is_query": torch.tensor([True, False, True])}
        >>> torch.equal(towers(features)[1], towers.passage_encoder({"input_ids": torch.tensor([[5, 6]])})[0])
        True
    """

    def __init__(self, query_encoder: nn.Module, passage_encoder: nn.Module) -> None:
        super().__init__()
        for name, tower in (("query_encoder", query_encoder), ("passage_encoder", passage_encoder)):
            if not isinstance(tower, nn.Module):
                raise InputTypeError(f"{name} must be a torch.nn.Module, got {type(tower).__name__}.")
        dims = (
            getattr(query_encoder, "embedding_dim", None),
            getattr(passage_encoder, "embedding_dim", None),
        )
        if None not in dims and dims[0] != dims[1]:
            raise ValueError(
                f"query_encoder embeds to {dims[0]} dimensions but passage_encoder to {dims[1]}; they must match."
            )
        self.query_encoder, self.passage_encoder = query_encoder, passage_encoder
        self.embedding_dim = dims[0]

    def forward(self, features: Any) -> torch.Tensor:
        """Embed every row with its tower; ``(B, embedding_dim)`` in the rows' order."""
        is_query = features.get("is_query") if isinstance(features, Mapping) else None
        if not isinstance(is_query, torch.Tensor) or is_query.dtype != torch.bool or is_query.ndim != 1:
            raise InputTypeError(
                "TwoTowerEncoder needs features['is_query'], a (B,) bool tensor, got "
                f"{describe(is_query) if is_query is not None else 'no is_query'}."
            )
        sizes = {key: value.shape[0] for key, value in features.items() if isinstance(value, torch.Tensor)}
        if is_query.numel() == 0 or set(sizes.values()) != {is_query.numel()}:
            raise ValueError(f"TwoTowerEncoder needs features with one batch size >= 1, got rows {sizes}.")
        rows = (is_query.nonzero().squeeze(1), (~is_query).nonzero().squeeze(1))
        parts, unused = [], []
        for tower, index in zip((self.query_encoder, self.passage_encoder), rows):
            if index.numel():
                parts.append(tower({key: value.index_select(0, index) for key, value in features.items()}))
            else:
                unused.append(tower)
        dtype = parts[0].dtype if len(parts) == 1 else torch.promote_types(parts[0].dtype, parts[1].dtype)
        order = torch.cat([index for index in rows if index.numel()])
        embeddings = torch.cat([part.to(dtype) for part in parts]).index_select(0, torch.argsort(order))
        for tower in unused:  # a zero that carries every parameter of the idle tower into the graph
            embeddings = embeddings + sum(param.sum() for param in tower.parameters()) * 0
        return embeddings
