"""Small encoders that map a batch of features to ``(B, embedding_dim)`` embeddings.

* :class:`Conv1dEncoder`: a 1-D CNN for sequences such as MNIST-1D, ``(B, L)`` or ``(B, C, L)``.
* :class:`MLPEncoder`: a multi-layer perceptron for flat vectors (scikit-learn's digits, tabular
  features); any ``(B, ...)`` input is flattened first.

Both are plain :class:`torch.nn.Module` objects with keyword arguments only, so a YAML section maps to
them one to one (see :mod:`composer_dynsample.config`).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

__all__ = ["Conv1dEncoder", "MLPEncoder"]

_ACTIVATIONS: dict[str, type[nn.Module]] = {"relu": nn.ReLU, "gelu": nn.GELU, "silu": nn.SiLU}
_NORMS = ("batch", "none")
_POOLINGS = ("avg", "max", "avgmax", "flatten")


def _check_positive_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}.")
    return value


def _check_choice(name: str, value: object, choices: Sequence[str]) -> str:
    if value not in choices:
        raise ValueError(f"{name} must be one of {list(choices)}, got {value!r}.")
    return str(value)


def _check_dropout(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value < 1.0:
        raise ValueError(f"dropout must be a number in [0, 1), got {value!r}.")
    return float(value)


def _per_layer(name: str, value: int | Sequence[int], num_layers: int) -> list[int]:
    """Expand an int to ``num_layers`` copies, or check a sequence of ``num_layers`` positive ints."""
    values = [value] * num_layers if isinstance(value, int) and not isinstance(value, bool) else value
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence) or len(values) != num_layers:
        raise ValueError(
            f"{name} must be an integer or a list of {num_layers} integers (one per layer), got {value!r}."
        )
    return [_check_positive_int(f"{name}[{i}]", v) for i, v in enumerate(values)]


class Conv1dEncoder(nn.Module):
    """A 1-D CNN: ``num_layers`` blocks of Conv1d, norm and activation, then pooling and a linear layer.

    Block ``i`` is ``Conv1d(kernel_size, stride=strides[i], padding=kernel_size // 2)``, then BatchNorm
    (``norm="batch"``) and the activation. The last feature map is pooled over time (``"avg"``,
    ``"max"``, ``"avgmax"``: both concatenated) or flattened (``"flatten"``, which needs
    ``input_length``), and projected to ``embedding_dim`` by a linear layer (after optional dropout).

    Args:
        input_length (int, optional): Sequence length ``L``; required for ``pooling="flatten"``, else
            only checked. Default: ``None``.
        in_channels (int): Input channels ``C``; a ``(B, L)`` input is read as one channel. Default: ``1``.
        channels (int | Sequence[int]): Output channels of every block, or one value per block.
            Default: ``64``.
        num_layers (int): Number of conv blocks. Default: ``4``.
        kernel_size (int): Odd kernel size of every conv. Default: ``5``.
        strides (int | Sequence[int]): Stride of every block, or one per block. Default: ``(1, 2, 2, 2)``.
        norm (str): ``"batch"`` (BatchNorm1d, conv without bias) or ``"none"``. Default: ``"batch"``.
        activation (str): ``"relu"``, ``"gelu"`` or ``"silu"``. Default: ``"relu"``.
        pooling (str): ``"avg"``, ``"max"``, ``"avgmax"`` or ``"flatten"``. Default: ``"flatten"``.
        embedding_dim (int): Output dimension. Default: ``64``.
        dropout (float): Dropout before the linear layer, in ``[0, 1)``. Default: ``0.0``.

    Raises:
        ValueError: If an argument is out of range, or ``pooling="flatten"`` lacks ``input_length``.

    Example:
        >>> encoder = Conv1dEncoder(input_length=40, channels=16, embedding_dim=8)
        >>> encoder(torch.randn(3, 40)).shape, encoder(torch.randn(3, 1, 40)).shape
        (torch.Size([3, 8]), torch.Size([3, 8]))
    """

    def __init__(
        self,
        *,
        input_length: int | None = None,
        in_channels: int = 1,
        channels: int | Sequence[int] = 64,
        num_layers: int = 4,
        kernel_size: int = 5,
        strides: int | Sequence[int] = (1, 2, 2, 2),
        norm: str = "batch",
        activation: str = "relu",
        pooling: str = "flatten",
        embedding_dim: int = 64,
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        num_layers = _check_positive_int("num_layers", num_layers)
        self.in_channels = _check_positive_int("in_channels", in_channels)
        widths = _per_layer("channels", channels, num_layers)
        steps = _per_layer("strides", strides, num_layers)
        kernel_size = _check_positive_int("kernel_size", kernel_size)
        if kernel_size % 2 == 0:
            raise ValueError(
                f"kernel_size must be odd (the padding keeps lengths aligned), got {kernel_size}."
            )
        self.norm = _check_choice("norm", norm, _NORMS)
        act = _ACTIVATIONS[_check_choice("activation", activation, list(_ACTIVATIONS))]
        self.pooling = _check_choice("pooling", pooling, _POOLINGS)
        self.embedding_dim = _check_positive_int("embedding_dim", embedding_dim)
        self.input_length = (
            None if input_length is None else _check_positive_int("input_length", input_length)
        )

        blocks: list[nn.Module] = []
        width_in, length = self.in_channels, self.input_length
        for width, stride in zip(widths, steps):
            blocks.append(
                nn.Conv1d(
                    width_in,
                    width,
                    kernel_size,
                    stride=stride,
                    padding=kernel_size // 2,
                    bias=self.norm == "none",
                )
            )
            if self.norm == "batch":
                blocks.append(nn.BatchNorm1d(width))
            blocks.append(act())
            width_in = width
            if length is not None:
                length = (length + 2 * (kernel_size // 2) - kernel_size) // stride + 1
        self.features = nn.Sequential(*blocks)
        if self.pooling == "flatten":
            if length is None:
                raise ValueError("pooling='flatten' needs input_length (the sequence length), got None.")
            head_in = width_in * length
        else:
            head_in = width_in * (2 if self.pooling == "avgmax" else 1)
        self.dropout = nn.Dropout(_check_dropout(dropout))
        self.head = nn.Linear(head_in, self.embedding_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Embed ``(B, L)`` or ``(B, C, L)`` sequences to ``(B, embedding_dim)``."""
        if x.ndim == 2 and self.in_channels == 1:
            x = x.unsqueeze(1)
        if x.ndim != 3 or x.shape[1] != self.in_channels:
            raise ValueError(
                f"Conv1dEncoder expects (B, L) or (B, {self.in_channels}, L) input, got shape {tuple(x.shape)}."
            )
        if self.input_length is not None and x.shape[-1] != self.input_length:
            raise ValueError(
                f"Conv1dEncoder was built for input_length={self.input_length}, got length {x.shape[-1]}."
            )
        h = self.features(x)
        if self.pooling == "flatten":
            h = h.flatten(1)
        elif self.pooling == "avg":
            h = h.mean(-1)
        elif self.pooling == "max":
            h = h.amax(-1)
        else:
            h = torch.cat([h.mean(-1), h.amax(-1)], dim=1)
        return self.head(self.dropout(h))


class MLPEncoder(nn.Module):
    """A multi-layer perceptron: ``Linear -> [BatchNorm] -> activation -> [Dropout]`` per hidden layer.

    The input ``(B, ...)`` is flattened to ``(B, in_features)``; a final linear layer maps the last
    hidden layer to ``embedding_dim``.

    Args:
        in_features (int): Number of input features after flattening.
        hidden_dims (Sequence[int]): Widths of the hidden layers (may be empty). Default: ``(256, 256)``.
        embedding_dim (int): Output dimension. Default: ``64``.
        norm (str): ``"batch"`` or ``"none"``. Default: ``"batch"``.
        activation (str): ``"relu"``, ``"gelu"`` or ``"silu"``. Default: ``"relu"``.
        dropout (float): Dropout after every hidden activation, in ``[0, 1)``. Default: ``0.0``.

    Raises:
        ValueError: If an argument is out of range.

    Example:
        >>> encoder = MLPEncoder(in_features=64, hidden_dims=[32], embedding_dim=8)
        >>> encoder(torch.randn(5, 64)).shape, encoder(torch.randn(5, 8, 8)).shape
        (torch.Size([5, 8]), torch.Size([5, 8]))
    """

    def __init__(
        self,
        *,
        in_features: int,
        hidden_dims: Sequence[int] = (256, 256),
        embedding_dim: int = 64,
        norm: str = "batch",
        activation: str = "relu",
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        self.in_features = _check_positive_int("in_features", in_features)
        if isinstance(hidden_dims, (str, bytes)) or not isinstance(hidden_dims, Sequence):
            raise ValueError(f"hidden_dims must be a list of integers >= 1, got {hidden_dims!r}.")
        widths = [_check_positive_int(f"hidden_dims[{i}]", w) for i, w in enumerate(hidden_dims)]
        self.embedding_dim = _check_positive_int("embedding_dim", embedding_dim)
        norm = _check_choice("norm", norm, _NORMS)
        act = _ACTIVATIONS[_check_choice("activation", activation, list(_ACTIVATIONS))]
        rate = _check_dropout(dropout)
        layers: list[nn.Module] = []
        width_in = self.in_features
        for width in widths:
            layers.append(nn.Linear(width_in, width, bias=norm == "none"))
            if norm == "batch":
                layers.append(nn.BatchNorm1d(width))
            layers.append(act())
            if rate > 0:
                layers.append(nn.Dropout(rate))
            width_in = width
        layers.append(nn.Linear(width_in, self.embedding_dim))
        self.layers = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Embed ``(B, ...)`` inputs with ``in_features`` values each to ``(B, embedding_dim)``."""
        flat = x.flatten(1)
        if flat.shape[1] != self.in_features:
            raise ValueError(
                f"MLPEncoder was built for in_features={self.in_features}, got input of shape "
                f"{tuple(x.shape)} ({flat.shape[1]} features)."
            )
        return self.layers(flat)
