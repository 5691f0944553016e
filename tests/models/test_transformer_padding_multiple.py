"""Padding to a multiple of 8 changes shapes, not values: a tiny BERT folder gives the same embeddings, InfoNCE
loss and gradients for a batch padded to its longest row and to a multiple of 8, and a run padded so (as
on a CUDA device) trains the same batches to the same losses and weights as one unpadded (the CPU's
default), to float rounding, once dropout is off (dropout draws its masks over the padded shape)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

pytest.importorskip("tokenizers")
pytest.importorskip("transformers")
pytest.importorskip("sentence_transformers")

from composer_dynsample.config import load_config
from composer_dynsample.config.run import build_run
from composer_dynsample.data import TextCollate
from composer_dynsample.models.transformer import TransformerEncoder
from tests.cli.helpers import write_tiny_pairs_config
from tests.models.folders import save_sentence_folder
from tests.models.text_helpers import record_widths

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

ROUNDING = {"atol": 1e-5, "rtol": 1e-5}
PADDED = ["dataloader.pad_to_multiple_of=8", "model.encoder.pad_to_multiple_of=8"]


@pytest.fixture(scope="module")
def config(tmp_path_factory) -> str:
    """Tiny pairs and a mean-pooling sentence-transformers folder cut at 21 tokens (not a multiple of 8)."""
    folder = tmp_path_factory.mktemp("padding_multiple")
    model_folder = save_sentence_folder(folder / "st", pooling="mean", max_seq_length=21)
    data = {
        "name": "pairs",
        "path": str(folder / "train.jsonl"),
        "test_path": str(folder / "test.jsonl"),
        "cache_dir": str(folder / "cache"),
    }
    encoder = {"name": "transformer", "path": str(model_folder)}
    model = {"encoder": encoder, "loss": {"name": "info_nce", "temperature": 0.05}}
    return write_tiny_pairs_config(folder, data, model, lr=0.001)


def _loss_and_grads(model, batch) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
    model.zero_grad()
    embeddings = model(batch)
    loss = model.loss(embeddings, batch)
    loss.backward()
    grads = [p.grad.clone() for p in model.parameters() if p.grad is not None]
    return embeddings.detach(), loss.detach(), grads


@pytest.mark.parametrize("trim_padding", [True, False])
def test_a_batch_padded_to_8_embeds_and_scores_as_unpadded(config, tmp_path, trim_padding):
    run = build_run(load_config(config), tmp_path / "run")
    model, store = run.model.eval(), run.splits.train  # eval: no dropout masks to compare
    model.encoder.trim_padding = trim_padding
    rows = list(range(16))
    plain = TextCollate(store)(rows)
    padded = TextCollate(store, pad_to_multiple_of=8)(rows)
    width = plain["features"]["input_ids"].shape[1]
    assert width % 8 != 0 and padded["features"]["input_ids"].shape[1] == -(-width // 8) * 8
    embeddings, loss, grads = _loss_and_grads(model, plain)
    for multiple in (None, 8):  # the encoder's groups cut to their longest row, then to a multiple of 8
        model.encoder.pad_to_multiple_of = multiple
        wide_embeddings, wide_loss, wide_grads = _loss_and_grads(model, padded)
        torch.testing.assert_close(wide_embeddings, embeddings, **ROUNDING)
        torch.testing.assert_close(wide_loss, loss, **ROUNDING)
        for wide, narrow in zip(wide_grads, grads, strict=True):
            torch.testing.assert_close(wide, narrow, atol=1e-5, rtol=1e-4)


def test_the_groups_of_short_and_long_rows_are_cut_to_multiples_of_8(monkeypatch):
    config = {"model_type": "bert", "hidden_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2,
              "intermediate_size": 32, "max_position_embeddings": 64}  # fmt: skip
    torch.manual_seed(0)
    encoder = TransformerEncoder(vocab_size=50, config=config, pad_to_multiple_of=8).eval()
    lengths = torch.tensor([3, 37, 5, 36] * 4)
    mask = (torch.arange(40)[None, :] < lengths[:, None]).long()
    ids = torch.randint(5, 50, mask.shape, generator=torch.Generator().manual_seed(0)) * mask
    widths = record_widths(encoder, monkeypatch)
    rounded = encoder({"input_ids": ids, "attention_mask": mask})
    assert sorted(widths) == [(8, 8), (8, 40)]  # 5 -> 8; 37 -> 40, the batch's width
    widths.clear()
    encoder.pad_to_multiple_of = None
    exact = encoder({"input_ids": ids, "attention_mask": mask})
    assert sorted(widths) == [(8, 5), (8, 37)]
    torch.testing.assert_close(rounded, exact, **ROUNDING)


@pytest.mark.parametrize("value", [0, 2.5, "8"])
def test_a_wrong_multiple_is_refused_naming_the_argument(value):
    with pytest.raises(ValueError, match="pad_to_multiple_of must be an integer >= 1, got"):
        TransformerEncoder(vocab_size=50, config={"model_type": "bert"}, pad_to_multiple_of=value)


def _train(
    config: str, run_dir: Path, overrides: list[str]
) -> tuple[list[dict], torch.Tensor, list[torch.Tensor]]:
    sgd = ["optimizer={name: sgd, lr: 0.5}"]  # SGD keeps float-rounding differences as small as they are
    run = build_run(load_config(config, [*sgd, *overrides]), run_dir)
    for module in run.model.modules():
        if isinstance(module, nn.Dropout):
            module.p = 0.0  # the same (no) masks whatever the shape; BERT's attention dropout reads this p
    batches = list(run.train_dataloader)
    run.trainer.fit()
    return batches, run.trainer.state.loss.detach(), [p.detach().clone() for p in run.model.parameters()]


def test_a_padded_run_trains_the_same_batches_to_the_same_losses(config, tmp_path):
    padded_batches, padded_loss, padded_weights = _train(config, tmp_path / "padded", PADDED)
    plain_batches, plain_loss, plain_weights = _train(config, tmp_path / "plain", [])
    assert len(padded_batches) == len(plain_batches) >= 2
    widths = [batch["features"]["input_ids"].shape[1] for batch in plain_batches]
    assert any(width % 8 for width in widths)  # the padding does something
    for padded, plain in zip(padded_batches, plain_batches):
        assert torch.equal(padded["index"], plain["index"])  # the same rows, in the same order
        ids, wide = plain["features"]["input_ids"], padded["features"]["input_ids"]
        assert wide.shape[1] % 8 == 0 and torch.equal(wide[:, : ids.shape[1]], ids)
        assert not padded["features"]["attention_mask"][:, ids.shape[1] :].any()
    torch.testing.assert_close(padded_loss, plain_loss, **ROUNDING)
    for wide, narrow in zip(padded_weights, plain_weights, strict=True):
        torch.testing.assert_close(wide, narrow, **ROUNDING)
