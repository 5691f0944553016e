"""Small encoders that map a batch of features to ``(B, embedding_dim)`` embeddings.

* :class:`Conv1dEncoder`: a 1-D CNN for sequences such as MNIST-1D, ``(B, L)`` or ``(B, C, L)``.
* :class:`Conv2dEncoder`: a 2-D CNN for images such as the glyphs, ``(B, H, W)`` or ``(B, C, H, W)``.
* :class:`MLPEncoder`: a multi-layer perceptron for flat vectors (scikit-learn's digits, tabular
  features); any ``(B, ...)`` input is flattened first.

All are plain :class:`torch.nn.Module` objects with keyword arguments only, so a YAML section maps to
them one to one (see :mod:`composer_dynsample.config`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

import torch
from torch import nn

from composer_dynsample.validation import check_choice, check_float, check_int, is_int

__all__ = ["Conv1dEncoder", "Conv2dEncoder", "MLPEncoder"]

_ACTIVATIONS: dict[str, type[nn.Module]] = {"relu": nn.ReLU, "gelu": nn.GELU, "silu": nn.SiLU}
_NORMS = ("batch", "none")
_POOLINGS = ("avg", "max", "avgmax", "flatten")


def _check_positive_int(name: str, value: object) -> int:
    return check_int(name, value, minimum=1)  # type: ignore[return-value]


def _check_dropout(value: object) -> float:
    return check_float("dropout", value, minimum=0, maximum=1, strict_maximum=True)


def _per_layer(name: str, value: int | Sequence[int], num_layers: int, per: str = "layer") -> list[int]:
    """Expand an int to ``num_layers`` copies, or check a sequence of ``num_layers`` positive ints."""
    values = [value] * num_layers if is_int(value) else value
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence) or len(values) != num_layers:
        raise ValueError(
            f"{name} must be an integer or a list of {num_layers} integers (one per {per}), got {value!r}."
        )
    return [_check_positive_int(f"{name}[{i}]", v) for i, v in enumerate(values)]


def _check_kernel_size(kernel_size: object) -> int:
    size = _check_positive_int("kernel_size", kernel_size)
    if size % 2 == 0:
        raise ValueError(f"kernel_size must be odd (the padding keeps lengths aligned), got {size}.")
    return size


def _pool(h: torch.Tensor, pooling: str, spatial_dims: tuple[int, ...]) -> torch.Tensor:
    """Flatten the feature map, or pool it over ``spatial_dims`` (``avgmax`` concatenates both)."""
    if pooling == "flatten":
        return h.flatten(1)
    if pooling == "avg":
        return h.mean(spatial_dims)
    if pooling == "max":
        return h.amax(spatial_dims)
    return torch.cat([h.mean(spatial_dims), h.amax(spatial_dims)], dim=1)


class _ConvArguments(NamedTuple):
    """The checked arguments shared by :class:`Conv1dEncoder` and :class:`Conv2dEncoder`."""

    in_channels: int
    widths: list[int]
    strides: list[int]
    kernel_size: int
    norm: str
    activation: type[nn.Module]
    pooling: str
    embedding_dim: int

    @classmethod
    def check(
        cls,
        num_layers: object,
        in_channels: object,
        channels: int | Sequence[int],
        strides: int | Sequence[int],
        kernel_size: object,
        norm: object,
        activation: object,
        pooling: object,
        embedding_dim: object,
    ) -> _ConvArguments:
        layers = _check_positive_int("num_layers", num_layers)
        return cls(
            in_channels=_check_positive_int("in_channels", in_channels),
            widths=_per_layer("channels", channels, layers),
            strides=_per_layer("strides", strides, layers),
            kernel_size=_check_kernel_size(kernel_size),
            norm=check_choice("norm", norm, _NORMS),
            activation=_ACTIVATIONS[check_choice("activation", activation, _ACTIVATIONS)],
            pooling=check_choice("pooling", pooling, _POOLINGS),
            embedding_dim=_check_positive_int("embedding_dim", embedding_dim),
        )

    def blocks(self, conv: type[nn.Module], batch_norm: type[nn.Module]) -> nn.Sequential:
        """``conv -> [batch norm] -> activation`` per layer; the padding keeps ``size / stride`` per axis."""
        layers: list[nn.Module] = []
        width_in = self.in_channels
        for width, stride in zip(self.widths, self.strides):
            padding = self.kernel_size // 2
            bias = self.norm == "none"
            layers.append(conv(width_in, width, self.kernel_size, stride=stride, padding=padding, bias=bias))
            if self.norm == "batch":
                layers.append(batch_norm(width))
            layers.append(self.activation())
            width_in = width
        return nn.Sequential(*layers)

    def output_size(self, size: int) -> int:
        """The length of one spatial axis after the conv blocks."""
        for stride in self.strides:
            size = (size + 2 * (self.kernel_size // 2) - self.kernel_size) // stride + 1
        return size

    def head_features(self, flat_size: int) -> int:
        """The number of features the linear head receives (``flat_size`` positions when flattened)."""
        if self.pooling == "flatten":
            return self.widths[-1] * flat_size
        return self.widths[-1] * (2 if self.pooling == "avgmax" else 1)


class _ConvEncoder(nn.Module):
    """What :class:`Conv1dEncoder` and :class:`Conv2dEncoder` share: blocks, pooling, head, input checks."""

    _conv: type[nn.Module]
    _batch_norm: type[nn.Module]
    _axes: str  # the spatial axes' names, "L" or "H, W"
    _size_name: str  # "input_length" or "input_size"
    _got: str  # how the wrong size is named in the error

    def __init__(self, size: tuple[int, ...] | None, conv: _ConvArguments, dropout: float, what: str) -> None:
        super().__init__()
        self.in_channels, self.norm, self.pooling = conv.in_channels, conv.norm, conv.pooling
        self.embedding_dim = conv.embedding_dim
        self.features = conv.blocks(self._conv, self._batch_norm)
        if self.pooling == "flatten" and size is None:
            raise ValueError(f"pooling='flatten' needs {self._size_name} ({what}), got None.")
        self._built_size = size  # the spatial size given at construction, checked in forward
        positions = 0 if size is None else math.prod(conv.output_size(axis) for axis in size)
        self.dropout = nn.Dropout(_check_dropout(dropout))
        self.head = nn.Linear(conv.head_features(positions), self.embedding_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Embed ``(B, *spatial)`` or ``(B, C, *spatial)`` inputs to ``(B, embedding_dim)``."""
        spatial = self._axes.count(",") + 1
        if x.ndim == spatial + 1 and self.in_channels == 1:
            x = x.unsqueeze(1)
        name = type(self).__name__
        if x.ndim != spatial + 2 or x.shape[1] != self.in_channels:
            raise ValueError(
                f"{name} expects (B, {self._axes}) or (B, {self.in_channels}, {self._axes}) input, "
                f"got shape {tuple(x.shape)}."
            )
        size, built = tuple(x.shape[2:]), self._built_size
        if built is not None and size != built:
            value = built[0] if spatial == 1 else built
            got = size[0] if spatial == 1 else size
            raise ValueError(f"{name} was built for {self._size_name}={value}, got {self._got} {got}.")
        h = _pool(self.features(x), self.pooling, tuple(range(-spatial, 0)))
        return self.head(self.dropout(h))


class Conv1dEncoder(_ConvEncoder):
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

    _conv, _batch_norm, _axes, _size_name, _got = nn.Conv1d, nn.BatchNorm1d, "L", "input_length", "length"

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
        conv = _ConvArguments.check(
            num_layers, in_channels, channels, strides, kernel_size, norm, activation, pooling, embedding_dim
        )
        length = None if input_length is None else _check_positive_int("input_length", input_length)
        super().__init__(None if length is None else (length,), conv, dropout, "the sequence length")

    @property
    def input_length(self) -> int | None:
        """The sequence length given at construction (checked in ``forward``), or ``None``."""
        return None if self._built_size is None else self._built_size[0]


class Conv2dEncoder(_ConvEncoder):
    """A 2-D CNN: ``num_layers`` blocks of Conv2d, norm and activation, then pooling and a linear layer.

    The image counterpart of :class:`Conv1dEncoder`, with the same arguments: block ``i`` is
    ``Conv2d(kernel_size, stride=strides[i], padding=kernel_size // 2)``, then BatchNorm
    (``norm="batch"``) and the activation. The last feature map is pooled over both spatial axes
    (``"avg"``, ``"max"``, ``"avgmax"``: both concatenated) or flattened (``"flatten"``, which needs
    ``input_size``), and projected to ``embedding_dim`` by a linear layer (after optional dropout).
    The defaults suit 32 x 32 glyphs: four blocks take them to a 4 x 4 map of 64 channels. The first
    block strides by 2: a full-resolution first block of 64 channels costs about ten times as much per
    training step on a CPU (about 1 s instead of 0.1 s for 128 images on 2 cores).

    Args:
        input_size (int | Sequence[int], optional): Image size ``H`` (square) or ``(H, W)``; required
            for ``pooling="flatten"``, else only checked. Default: ``None``.
        in_channels (int): Input channels ``C``; a ``(B, H, W)`` input is read as one channel.
            Default: ``1``.
        channels (int | Sequence[int]): Output channels of every block, or one value per block.
            Default: ``(32, 64, 64, 64)``.
        num_layers (int): Number of conv blocks. Default: ``4``.
        kernel_size (int): Odd kernel size of every conv. Default: ``3``.
        strides (int | Sequence[int]): Stride of every block, or one per block. Default: ``(2, 2, 2, 1)``.
        norm (str): ``"batch"`` (BatchNorm2d, conv without bias) or ``"none"``. Default: ``"batch"``.
        activation (str): ``"relu"``, ``"gelu"`` or ``"silu"``. Default: ``"relu"``.
        pooling (str): ``"avg"``, ``"max"``, ``"avgmax"`` or ``"flatten"``. Default: ``"avg"``.
        embedding_dim (int): Output dimension. Default: ``64``.
        dropout (float): Dropout before the linear layer, in ``[0, 1)``. Default: ``0.0``.

    Raises:
        ValueError: If an argument is out of range, or ``pooling="flatten"`` lacks ``input_size``.

    Example:
        >>> encoder = Conv2dEncoder(input_size=32, channels=8, embedding_dim=4)
        >>> encoder(torch.randn(3, 32, 32)).shape, encoder(torch.randn(3, 1, 32, 32)).shape
        (torch.Size([3, 4]), torch.Size([3, 4]))
    """

    _conv, _batch_norm, _axes, _size_name, _got = (
        nn.Conv2d,
        nn.BatchNorm2d,
        "H, W",
        "input_size",
        "images of size",
    )

    def __init__(
        self,
        *,
        input_size: int | Sequence[int] | None = None,
        in_channels: int = 1,
        channels: int | Sequence[int] = (32, 64, 64, 64),
        num_layers: int = 4,
        kernel_size: int = 3,
        strides: int | Sequence[int] = (2, 2, 2, 1),
        norm: str = "batch",
        activation: str = "relu",
        pooling: str = "avg",
        embedding_dim: int = 64,
        dropout: float = 0.0,
    ) -> None:
        conv = _ConvArguments.check(
            num_layers, in_channels, channels, strides, kernel_size, norm, activation, pooling, embedding_dim
        )
        size = None if input_size is None else tuple(_per_layer("input_size", input_size, 2, "axis"))
        super().__init__(size, conv, dropout, "the image size H or (H, W)")

    @property
    def input_size(self) -> tuple[int, int] | None:
        """The image size ``(H, W)`` given at construction (checked in ``forward``), or ``None``."""
        return self._built_size  # type: ignore[return-value]


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
        norm = check_choice("norm", norm, _NORMS)
        act = _ACTIVATIONS[check_choice("activation", activation, _ACTIVATIONS)]
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
