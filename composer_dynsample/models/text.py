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

:class:`TransformerEncoder` is defined in :mod:`~composer_dynsample.models.transformer` and the token
helpers (:func:`token_inputs`, :func:`masked_mean_pool`, :func:`masked_max_pool`,
:func:`import_text_extra`) in :mod:`~composer_dynsample.models.tokens`; all are importable from here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from composer_dynsample.models.tokens import (
    _positive,
    _projection,
    import_text_extra,
    masked_max_pool,
    masked_mean_pool,
    range_checked_after,
    token_inputs,
)
from composer_dynsample.models.transformer import TRANSFORMER_POOLINGS, TransformerEncoder
from composer_dynsample.validation import (
    InputTypeError,
    check_bool,
    check_choice,
    check_float,
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

BAG_POOLINGS = ("mean", "max", "weighted_mean")
_ACTIVATIONS: dict[str, type[nn.Module]] = {"relu": nn.ReLU, "gelu": nn.GELU, "silu": nn.SiLU}


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
        checked = getattr(self, "_range_checked", False)
        ids, mask = token_inputs(features, type(self).__name__, self.vocab_size, check_range=not checked)
        self._range_checked = range_checked_after(ids)
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

    With ``frozen_passages`` the passage tower is fixed (ADORE, Zhan et al. 2021): its parameters take no
    gradient, it runs in eval mode under ``no_grad`` whatever the model's mode, so a passage's embedding
    never changes. An :class:`~composer_dynsample.EmbeddingTable` then holds exact passage rows (its warm
    start's), and a mined-negatives sampler that re-encodes its anchors first (the table's
    ``fresh_upcoming``) ranks the current query model against them: exact, current negatives. Give both
    towers the same starting folder for one encoder whose passage side stays the starting copy.

    Args:
        query_encoder (torch.nn.Module): Embeds the rows where ``is_query`` is true.
        passage_encoder (torch.nn.Module): Embeds the other rows.
        frozen_passages (bool): Freeze the passage tower. Default: ``False``.

    Example:
        >>> towers = TwoTowerEncoder(BagOfTokensEncoder(vocab_size=50, token_dim=8),
        ...                          BagOfTokensEncoder(vocab_size=50, token_dim=8))
        >>> features = {"input_ids": torch.tensor([[3, 4], [5, 6], [7, 8]]),
        ...             "is_query": torch.tensor([True, False, True])}
        >>> torch.equal(towers(features)[1], towers.passage_encoder({"input_ids": torch.tensor([[5, 6]])})[0])
        True
    """

    def __init__(
        self, query_encoder: nn.Module, passage_encoder: nn.Module, frozen_passages: bool = False
    ) -> None:
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
        self.frozen_passages = check_bool("frozen_passages", frozen_passages)
        if self.frozen_passages:
            passage_encoder.requires_grad_(False)
            passage_encoder.eval()

    def train(self, mode: bool = True) -> TwoTowerEncoder:
        """Set the mode as ``nn.Module.train`` does; a frozen passage tower stays in eval mode."""
        super().train(mode)
        if self.frozen_passages:
            self.passage_encoder.eval()
        return self

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
            frozen = tower is self.passage_encoder and self.frozen_passages
            if index.numel():
                with torch.set_grad_enabled(torch.is_grad_enabled() and not frozen):
                    parts.append(
                        tower({key: value.index_select(0, index) for key, value in features.items()})
                    )
            elif not frozen:
                unused.append(tower)
        dtype = parts[0].dtype if len(parts) == 1 else torch.promote_types(parts[0].dtype, parts[1].dtype)
        order = torch.cat([index for index in rows if index.numel()])
        embeddings = torch.cat([part.to(dtype) for part in parts]).index_select(0, torch.argsort(order))
        for tower in unused:  # a zero that carries every parameter of the idle tower into the graph
            embeddings = embeddings + sum(param.sum() for param in tower.parameters()) * 0
        return embeddings
