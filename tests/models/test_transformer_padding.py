"""TransformerEncoder runs short and long rows apart, each cut to its own width: the same embeddings."""

from __future__ import annotations

import pytest
import torch

from composer_dynsample.models.tokens import length_groups

pytest.importorskip("transformers")

from composer_dynsample.models.transformer import TransformerEncoder
from tests.models.text_helpers import record_widths

BERT = {"model_type": "bert", "hidden_size": 16, "num_hidden_layers": 2, "num_attention_heads": 2,
        "intermediate_size": 32, "max_position_embeddings": 64}  # fmt: skip


def _batch(lengths: list[int], width: int, seed: int = 0) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, 50, (len(lengths), width), generator=generator)
    mask = (torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]).long()
    return {"input_ids": ids * mask, "attention_mask": mask}


def test_a_mask_in_host_memory_is_grouped_with_no_tensor_read():
    from composer_dynsample.testing import HostReadCounter

    mask = _batch([3, 40, 5, 38, 4, 40], 40)["attention_mask"]
    with HostReadCounter() as counter:
        assert length_groups(mask) is not None
    assert counter.total() == 0  # before: int, argmin, float and int of the cut, besides torch.equal


def test_rows_are_cut_where_the_two_groups_pad_least():
    mask = _batch([3, 40, 5, 38, 4, 40], 40)["attention_mask"]
    (short, short_longest), (long, long_longest) = length_groups(mask)
    assert sorted(short.tolist()) == [0, 2, 4] and sorted(long.tolist()) == [1, 3, 5]
    assert (short_longest, long_longest) == (5, 40)  # each group's longest row, read with the cut
    assert length_groups(_batch([30, 40, 35], 40)["attention_mask"]) is None  # saves under a quarter
    left = torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1]])
    assert length_groups(left) is None and length_groups(left[:1]) is None


@pytest.mark.parametrize("pooling", ["mean", "cls"])
def test_the_embeddings_and_gradients_are_those_of_the_whole_batch(pooling):
    torch.manual_seed(0)
    encoder = TransformerEncoder(vocab_size=50, config=BERT, pooling=pooling, embedding_dim=8).eval()
    features = _batch([3, 40, 5, 38, 4, 40, 2, 39], 40)
    assert length_groups(features["attention_mask"]) is not None  # the grouped path runs
    trimmed = encoder(features)
    trimmed.square().sum().backward()
    grads = [p.grad.clone() for p in encoder.parameters()]
    encoder.zero_grad()
    encoder.trim_padding = False
    whole = encoder(features)
    whole.square().sum().backward()
    torch.testing.assert_close(trimmed, whole, atol=1e-5, rtol=1e-5)
    for grouped, plain in zip(grads, (p.grad for p in encoder.parameters())):
        torch.testing.assert_close(grouped, plain, atol=1e-5, rtol=1e-4)


def test_a_batch_of_queries_and_passages_runs_fewer_positions(monkeypatch):
    encoder = TransformerEncoder(vocab_size=50, config=BERT).eval()
    widths = record_widths(encoder, monkeypatch)
    encoder(_batch([4, 40] * 8, 40))
    assert sorted(widths) == [(8, 4), (8, 40)]  # 192 positions a layer where the batch had 640
    widths.clear()
    TransformerEncoder.forward(encoder, _batch([30, 40] * 4, 40))
    assert widths == [(8, 40)]
