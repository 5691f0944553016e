"""The metrics in Composer evaluators: leave-one-out, and a train-set gallery attached at EVAL_START."""

from __future__ import annotations

import pytest
import torch
from composer import Trainer
from composer.core import Callback, Evaluator, State
from composer.loggers import InMemoryLogger, Logger
from composer.models import ComposerModel
from torch.utils.data import DataLoader

from composer_dynsample.callbacks.retrieval_gallery import RetrievalGallery
from composer_dynsample.data import GatherCollate, IndexDataset, TensorStore
from composer_dynsample.metrics import (
    MeanAveragePrecisionAtR,
    RetrievalMetrics,
    RetrievalRecallAtK,
    retrieval_metrics,
)


def make_store(n, seed):
    generator = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 4, (n,), generator=generator)
    centers = torch.randn(4, 6, generator=torch.Generator().manual_seed(99))
    return TensorStore(centers[labels] + torch.randn(n, 6, generator=generator), labels)


class Embed(ComposerModel):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Linear(6, 3)

    def forward(self, batch):
        return self.net(batch["features"])

    def loss(self, outputs, batch):
        return outputs.sum() * 0

    def get_metrics(self, is_train=False):
        if is_train:
            return {}
        return {
            "recall_at_1": RetrievalRecallAtK(1),
            "map_at_r": MeanAveragePrecisionAtR(),
            "all": RetrievalMetrics(ks=(1, 3)),
        }

    def update_metric(self, batch, outputs, metric):
        metric.update(outputs, batch["labels"])


class AttachGallery(Callback):
    """Sets the gallery on the metric copies the trainer uses for one evaluator."""

    def __init__(self, label, store):
        self.label, self.store = label, store

    def eval_start(self, state: State, logger: Logger) -> None:
        if state.dataloader_label == self.label:
            with torch.no_grad():
                embeddings = state.model.net(self.store.features)
            for metric in state.eval_metrics[self.label].values():
                metric.set_gallery(embeddings, self.store.labels)


def loader(store):
    return DataLoader(IndexDataset(store.labels), batch_size=16, collate_fn=GatherCollate(store))


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_composer_evaluators_log_the_metrics():
    train, test = make_store(60, seed=0), make_store(40, seed=1)
    model, memory = Embed(), InMemoryLogger()
    trainer = Trainer(
        model=model,
        eval_dataloader=[
            Evaluator(label="loo", dataloader=loader(test)),
            Evaluator(label="vs_train", dataloader=loader(test)),
        ],
        callbacks=[AttachGallery("vs_train", train)],
        loggers=[memory],
        progress_bar=False,
        device="cpu",
    )
    trainer.eval()
    with torch.no_grad():
        test_emb, train_emb = model.net(test.features), model.net(train.features)
    expected = {
        "loo": retrieval_metrics(test_emb, test.labels, ks=(1, 3)),
        "vs_train": retrieval_metrics(test_emb, test.labels, train_emb, train.labels, ks=(1, 3)),
    }
    assert expected["loo"]["map_at_r"] != expected["vs_train"]["map_at_r"]
    for label, values in expected.items():
        logged = memory.most_recent_values
        assert logged[f"metrics/{label}/recall_at_1"].item() == pytest.approx(values["recall_at_1"].item())
        assert logged[f"metrics/{label}/map_at_r"].item() == pytest.approx(values["map_at_r"].item())
        everything = logged[f"metrics/{label}/all"]
        assert {name: pytest.approx(value.item()) for name, value in everything.items()} == {
            name: value.item() for name, value in values.items()
        }


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_the_gallery_callback_keeps_dict_valued_metrics_in_its_history():
    # RetrievalMetrics computes a dict; RetrievalGallery called float() on it and aborted the evaluation.
    train, test = make_store(60, seed=0), make_store(40, seed=1)
    model, gallery = Embed(), RetrievalGallery(train, evaluator_label="vs_train")
    trainer = Trainer(
        model=model,
        eval_dataloader=[Evaluator(label="vs_train", dataloader=loader(test))],
        callbacks=[gallery],
        progress_bar=False,
        device="cpu",
    )
    trainer.eval()
    with torch.no_grad():
        expected = retrieval_metrics(
            model.net(test.features), test.labels, model.net(train.features), train.labels, ks=(1, 3)
        )
    (entry,) = gallery.history
    assert entry["all/map_at_r"] == pytest.approx(expected["map_at_r"].item())
    assert entry["all/recall_at_3"] == pytest.approx(expected["recall_at_3"].item())
    assert entry["recall_at_1"] == pytest.approx(expected["recall_at_1"].item())
