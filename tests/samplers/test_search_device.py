"""Where the corpus search of mined negatives runs: ``search_device`` (the CPU standing in for a GPU), and
the embedding table choosing the model's CUDA device for it."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import torch

from composer_dynsample.algorithms.embedding_table._training_set import (
    search_on_the_model_device as _search_on_the_model_device,
)
from composer_dynsample.samplers.mined_negatives import MinedNegativesPKBatchSampler
from tests.samplers.helpers import pairs_data, sampler_for


def _batches(device) -> np.ndarray:
    labels, is_passage, texts, first = pairs_data(60, 3)
    sampler = sampler_for(labels, is_passage, texts, 3, 2, window=4, skip_top=1)
    sampler.search_device = device
    sampler.update_neighbours(first)
    sampler.set_epoch(1)
    return sampler.global_batches(1)


def test_a_search_device_gives_the_batches_of_the_default_search():
    assert np.array_equal(_batches(torch.device("cpu")), _batches(None))
    assert np.array_equal(_batches("cpu"), _batches(None))


class _Model(torch.nn.Module):
    """A module whose parameters claim ``device`` (no GPU is needed to read it)."""

    def __init__(self, device: str) -> None:
        super().__init__()
        self.device = torch.device(device)

    def parameters(self, recurse: bool = True):
        yield SimpleNamespace(device=self.device)


def test_the_table_puts_the_search_on_the_model_s_cuda_device_unless_one_was_given():
    labels = torch.arange(40) // 2
    sampler = MinedNegativesPKBatchSampler(labels, 4, 1, is_passage=torch.arange(40) % 2 == 1)
    _search_on_the_model_device(sampler, _Model("cpu"))
    assert sampler.search_device is None  # a CPU model: the search stays where it is
    _search_on_the_model_device(sampler, _Model("cuda:1"))
    assert sampler.search_device == torch.device("cuda:1")
    sampler.search_device = "cpu"
    _search_on_the_model_device(sampler, _Model("cuda:0"))
    assert sampler.search_device == "cpu"  # given: kept
    _search_on_the_model_device(None, _Model("cuda:0"))  # no sampler: nothing to do
