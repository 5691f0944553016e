"""Conv2dEncoder: shapes, options, gradients and clear errors, mirroring the Conv1dEncoder tests."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from composer_dynsample.models.encoders import Conv2dEncoder


@pytest.mark.parametrize("pooling", ["avg", "max", "avgmax", "flatten"])
def test_shapes_for_every_pooling(pooling):
    encoder = Conv2dEncoder(input_size=32, channels=8, embedding_dim=5, pooling=pooling)
    assert encoder(torch.randn(3, 32, 32)).shape == (3, 5)
    assert encoder(torch.randn(3, 1, 32, 32)).shape == (3, 5)


def test_flatten_head_size_follows_the_strides_on_each_axis():
    encoder = Conv2dEncoder(input_size=(32, 20), channels=4, strides=[1, 2, 2, 2], pooling="flatten")
    # 32 -> 32 -> 16 -> 8 -> 4 and 20 -> 20 -> 10 -> 5 -> 3: 4 channels x 4 x 3 positions.
    assert encoder.head.in_features == 4 * 4 * 3
    assert encoder(torch.randn(2, 1, 32, 20)).shape == (2, 64)


def test_defaults_take_a_glyph_to_a_4_by_4_map_of_64_channels():
    encoder = Conv2dEncoder(input_size=32, pooling="flatten")
    convs = [m for m in encoder.modules() if isinstance(m, torch.nn.Conv2d)]
    assert [c.out_channels for c in convs] == [32, 64, 64, 64] and encoder.head.in_features == 64 * 4 * 4


def test_per_layer_channels_strides_and_multichannel_input():
    encoder = Conv2dEncoder(
        input_size=(17, 15), in_channels=3, channels=[4, 6, 8], num_layers=3, strides=[2, 1, 2], kernel_size=5
    )
    assert encoder(torch.randn(2, 3, 17, 15)).shape == (2, 64)
    convs = [m for m in encoder.modules() if isinstance(m, torch.nn.Conv2d)]
    assert [c.out_channels for c in convs] == [4, 6, 8]
    assert [c.stride for c in convs] == [(2, 2), (1, 1), (2, 2)]
    assert all(c.padding == (2, 2) and c.kernel_size == (5, 5) for c in convs)


def test_global_pooling_needs_no_size_and_accepts_any_size():
    encoder = Conv2dEncoder(channels=4, embedding_dim=3)  # default pooling "avg"
    assert encoder(torch.randn(2, 9, 13)).shape == encoder(torch.randn(2, 1, 40, 40)).shape == (2, 3)
    assert encoder.input_size is None


def test_options_build_the_expected_layers():
    plain = Conv2dEncoder(norm="none", activation="silu", dropout=0.2)
    assert not any(isinstance(m, torch.nn.BatchNorm2d) for m in plain.modules())
    assert any(isinstance(m, torch.nn.SiLU) for m in plain.modules())
    assert all(m.bias is not None for m in plain.modules() if isinstance(m, torch.nn.Conv2d))
    batch = Conv2dEncoder()
    assert sum(isinstance(m, torch.nn.BatchNorm2d) for m in batch.modules()) == 4
    assert all(m.bias is None for m in batch.modules() if isinstance(m, torch.nn.Conv2d))
    assert plain.dropout.p == 0.2


def test_numpy_integers_are_accepted_like_python_ints():
    encoder = Conv2dEncoder(input_size=np.int64(8), channels=np.int64(4), embedding_dim=np.int32(2))
    assert encoder.input_size == (8, 8) and encoder(torch.randn(2, 8, 8)).shape == (2, 2)


def test_trains_end_to_end_and_is_deterministic_in_eval():
    torch.manual_seed(0)
    encoder = Conv2dEncoder(input_size=16, channels=4, embedding_dim=3, pooling="avgmax")
    x = torch.rand(6, 1, 16, 16)
    encoder(x).pow(2).sum().backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in encoder.parameters())
    encoder.eval()
    with torch.no_grad():
        assert torch.equal(encoder(x), encoder(x))


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"pooling": "flatten"}, r"needs input_size"),
        ({"pooling": "mean"}, "pooling must be one of"),
        ({"kernel_size": 4}, "kernel_size must be odd"),
        ({"channels": [8, 8]}, r"channels must be an integer or a list of 4 integers \(one per layer\)"),
        ({"strides": 0}, r"strides\[0\] must be an integer >= 1"),
        ({"norm": "layer"}, "norm must be one of"),
        ({"activation": "tanh"}, "activation must be one of"),
        ({"embedding_dim": 0}, "embedding_dim must be an integer >= 1"),
        ({"dropout": 1.0}, r"dropout must be a number in \[0, 1\)"),
        ({"num_layers": True}, "num_layers must be an integer"),
        ({"in_channels": 0}, "in_channels must be an integer >= 1"),
        (
            {"input_size": (32, 32, 1)},
            r"input_size must be an integer or a list of 2 integers \(one per axis\)",
        ),
        ({"input_size": 0}, r"input_size\[0\] must be an integer >= 1"),
    ],
)
def test_rejects_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Conv2dEncoder(**kwargs)


def test_wrong_input_shapes_name_what_was_expected():
    with pytest.raises(
        ValueError, match=r"expects \(B, H, W\) or \(B, 1, H, W\) input, got shape \(2, 3, 8, 8\)"
    ):
        Conv2dEncoder()(torch.randn(2, 3, 8, 8))
    with pytest.raises(ValueError, match=r"expects \(B, H, W\) or \(B, 3, H, W\)"):
        Conv2dEncoder(in_channels=3)(torch.randn(2, 8, 8))
    with pytest.raises(ValueError, match=r"built for input_size=\(32, 32\), got images of size \(28, 28\)"):
        Conv2dEncoder(input_size=32)(torch.randn(2, 28, 28))
