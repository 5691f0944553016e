"""Conv1dEncoder and MLPEncoder: shapes, options, gradients and clear errors."""

from __future__ import annotations

import pytest
import torch

from composer_dynsample.models.encoders import Conv1dEncoder, MLPEncoder


@pytest.mark.parametrize("pooling", ["avg", "max", "avgmax", "flatten"])
def test_conv1d_shapes_for_every_pooling(pooling):
    encoder = Conv1dEncoder(input_length=40, channels=8, embedding_dim=5, pooling=pooling)
    assert encoder(torch.randn(3, 40)).shape == (3, 5)
    assert encoder(torch.randn(3, 1, 40)).shape == (3, 5)


def test_conv1d_per_layer_channels_strides_and_multichannel_input():
    encoder = Conv1dEncoder(
        input_length=33, in_channels=3, channels=[4, 6, 8], num_layers=3, strides=[2, 1, 2], kernel_size=3
    )
    assert encoder(torch.randn(2, 3, 33)).shape == (2, 64) and encoder.input_length == 33
    convs = [m for m in encoder.modules() if isinstance(m, torch.nn.Conv1d)]
    assert [c.out_channels for c in convs] == [4, 6, 8] and [c.stride[0] for c in convs] == [2, 1, 2]


def test_conv1d_global_pooling_needs_no_length_and_accepts_any_length():
    encoder = Conv1dEncoder(pooling="avg", channels=4, embedding_dim=3)
    assert encoder(torch.randn(2, 17)).shape == encoder(torch.randn(2, 50)).shape == (2, 3)
    assert encoder.input_length is None


def test_conv1d_options_build_the_expected_layers():
    plain = Conv1dEncoder(input_length=40, norm="none", activation="gelu", dropout=0.1)
    assert not any(isinstance(m, torch.nn.BatchNorm1d) for m in plain.modules())
    assert any(isinstance(m, torch.nn.GELU) for m in plain.modules())
    assert all(m.bias is not None for m in plain.modules() if isinstance(m, torch.nn.Conv1d))


def test_encoders_train_end_to_end():
    torch.manual_seed(0)
    for encoder, x in (
        (Conv1dEncoder(input_length=12, channels=4, embedding_dim=3), torch.randn(6, 12)),
        (MLPEncoder(in_features=12, hidden_dims=[8], embedding_dim=3), torch.randn(6, 12)),
    ):
        encoder(x).pow(2).sum().backward()
        assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in encoder.parameters())
        encoder.eval()
        with torch.no_grad():
            assert torch.equal(encoder(x), encoder(x))


def test_mlp_flattens_its_input_and_allows_no_hidden_layer():
    assert MLPEncoder(in_features=64, embedding_dim=8)(torch.randn(4, 8, 8)).shape == (4, 8)
    linear = MLPEncoder(in_features=5, hidden_dims=[], embedding_dim=2)
    assert [type(m) for m in linear.layers] == [torch.nn.Linear]
    with_dropout = MLPEncoder(in_features=5, hidden_dims=[4], norm="none", dropout=0.5)
    assert any(isinstance(m, torch.nn.Dropout) for m in with_dropout.modules())


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"pooling": "flatten"}, "needs input_length"),
        ({"input_length": 40, "pooling": "mean"}, "pooling must be one of"),
        ({"input_length": 40, "kernel_size": 4}, "kernel_size must be odd"),
        ({"input_length": 40, "channels": [8, 8]}, r"channels must be an integer or a list of 4"),
        ({"input_length": 40, "strides": 0}, r"strides\[0\] must be an integer >= 1"),
        ({"input_length": 40, "norm": "layer"}, "norm must be one of"),
        ({"input_length": 40, "activation": "tanh"}, "activation must be one of"),
        ({"input_length": 40, "embedding_dim": 0}, "embedding_dim must be an integer >= 1"),
        ({"input_length": 40, "dropout": 1.0}, r"dropout must be a number in \[0, 1\)"),
        ({"input_length": 40, "num_layers": True}, "num_layers must be an integer"),
    ],
)
def test_conv1d_rejects_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Conv1dEncoder(**kwargs)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"in_features": 0}, "in_features must be an integer >= 1"),
        ({"in_features": 4, "hidden_dims": 16}, "hidden_dims must be a list"),
        ({"in_features": 4, "hidden_dims": [16, -1]}, r"hidden_dims\[1\] must be an integer >= 1"),
        ({"in_features": 4, "norm": "group"}, "norm must be one of"),
    ],
)
def test_mlp_rejects_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        MLPEncoder(**kwargs)


def test_wrong_input_shapes_name_what_was_expected():
    with pytest.raises(ValueError, match=r"expects \(B, L\) or \(B, 1, L\)"):
        Conv1dEncoder(input_length=40)(torch.randn(2, 2, 40))
    with pytest.raises(ValueError, match="built for input_length=40, got length 30"):
        Conv1dEncoder(input_length=40)(torch.randn(2, 30))
    with pytest.raises(ValueError, match="built for in_features=64"):
        MLPEncoder(in_features=64)(torch.randn(2, 10))
