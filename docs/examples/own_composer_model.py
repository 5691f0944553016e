"""Your own ComposerModel trained on P x K batches with hard-negative mining, on 1 process or 2.

Run it as ``python docs/examples/own_composer_model.py``, or on 2 CPU processes over gloo as
``composer -n 2 docs/examples/own_composer_model.py``. It trains for a few seconds and prints the 1-NN
accuracy of held-out points before and after training.
"""

import torch
from composer import Trainer
from composer.models import ComposerModel
from composer.utils import dist
from torch import nn
from torch.utils.data import TensorDataset

from composer_dynsample import (
    HardNegativeMining,
    MinedBatch,
    PKBatchSampler,
    SetSamplerEpoch,
    TripletMarginLoss,
    mined_loss,
)
from composer_dynsample.samplers import build_dataloader

CLASSES, DIM = 12, 16


def clustered_points(per_class: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``per_class`` noisy points around each of 12 fixed centres in 16-d, and their labels."""
    centres = 1.5 * torch.randn(CLASSES, DIM, generator=torch.Generator().manual_seed(0))
    labels = torch.arange(CLASSES).repeat_interleave(per_class)
    noise = torch.randn(labels.numel(), DIM, generator=torch.Generator().manual_seed(seed))
    return centres[labels] + noise, labels


class MyEmbeddingModel(ComposerModel):
    """An MLP that maps a (features, label) batch to L2-normalised 8-d embeddings."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(DIM, 64), nn.ReLU(), nn.Linear(64, 8))
        self.loss_fn = TripletMarginLoss(margin=0.2)

    def forward(self, batch):
        features, _ = batch
        return nn.functional.normalize(self.net(features), dim=1)

    def loss(self, outputs, batch):
        if isinstance(outputs, MinedBatch):  # HardNegativeMining replaced the outputs at AFTER_FORWARD
            # = self.loss_fn(outputs.embeddings, outputs.labels, outputs.indices_tuple,
            #                outputs.ref_embeddings, outputs.ref_labels), the mined tuples against their pool
            return mined_loss(self.loss_fn, outputs)
        return self.loss_fn(outputs, batch[1])  # without the algorithm: every triplet of the batch

    def eval_forward(self, batch, outputs=None):
        if isinstance(outputs, MinedBatch):  # train metrics get the MinedBatch: take its embeddings
            return outputs.embeddings
        return outputs if outputs is not None else self.forward(batch)


def one_nn_accuracy(model: MyEmbeddingModel, gallery, queries) -> float:
    """The fraction of queries whose nearest gallery point (cosine) has their label."""
    model.eval()
    with torch.no_grad():
        gallery_embeddings, query_embeddings = model.eval_forward(gallery), model.eval_forward(queries)
    nearest = (query_embeddings @ gallery_embeddings.T).argmax(dim=1)
    return (gallery[1][nearest] == queries[1]).float().mean().item()


if __name__ == "__main__":
    features, labels = clustered_points(per_class=20, seed=1)  # 12 classes x 20 samples to train on
    held_out = clustered_points(per_class=10, seed=2)
    # P x K batches of 4 classes x 5 samples. Each rank takes its share of every epoch's batches: the
    # sampler reads the rank from the process group, or before the Trainer starts it from the launcher's env.
    sampler = PKBatchSampler(labels, classes_per_batch=4, samples_per_class=5, seed=0)
    torch.manual_seed(0)
    model = MyEmbeddingModel()
    before = one_nn_accuracy(model, (features, labels), held_out)
    trainer = Trainer(
        model=model,
        train_dataloader=build_dataloader(TensorDataset(features, labels), sampler),
        optimizers=torch.optim.Adam(model.parameters(), lr=1e-2),
        max_duration="4ep",
        # One forward pass per P x K batch, so that mining sees the whole batch.
        device_train_microbatch_size=sampler.batch_size,
        algorithms=[HardNegativeMining({"0ep": "semi_hard", "2ep": "batch_hard"})],
        callbacks=[SetSamplerEpoch()],
        progress_bar=False,
        seed=0,
    )
    trainer.fit()
    after = one_nn_accuracy(model, (features, labels), held_out)
    if dist.get_global_rank() == 0:
        print(f"1-NN accuracy on held-out points: {after:.3f} (before training: {before:.3f})")
