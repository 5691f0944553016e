"""build_dataloader refuses, before the first batch, what spawned workers cannot import."""

from __future__ import annotations

import multiprocessing
import subprocess
import sys
import textwrap
import types

import pytest
import torch
from torch.utils.data import ConcatDataset, Dataset, Subset, TensorDataset

from composer_dynsample import PKBatchSampler, build_dataloader
from composer_dynsample.samplers import dataloader as dataloader_module
from composer_dynsample.samplers.dataloader import worker_start_method

LABELS = torch.arange(16) % 4

NOTEBOOK = """
import torch
from torch.utils.data import Dataset
from composer_dynsample import PKBatchSampler, build_dataloader

class NotebookDataset(Dataset):
    def __init__(self, labels):
        self.labels = labels
    def __len__(self):
        return len(self.labels)
    def __getitem__(self, index):
        return index, self.labels[index]

labels = torch.arange(16) % 4
loader = build_dataloader(NotebookDataset(labels), PKBatchSampler(labels, 2, 2), {options})
indices, _ = next(iter(loader))
print("batch", len(indices))
"""


def _run(options: str) -> subprocess.CompletedProcess:
    code = textwrap.dedent(NOTEBOOK).format(options=options)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)


def _expected(workers: int, method: str, named: str = "the dataset's class NotebookDataset") -> str:
    return (
        f"ValueError: {named} is defined in an interactive __main__ (a notebook, IPython or python -c), which "
        f"the {workers} {method!r} DataLoader worker(s) cannot import (they would die at the first batch): "
        "move it into a module (a .py file) and import it from there, or use num_workers=0 or "
        "multiprocessing_context='fork'."
    )


def test_a_dataset_of_an_interactive_main_is_refused_with_spawned_workers():
    result = _run("num_workers=2, multiprocessing_context='spawn'")
    assert result.returncode != 0
    assert _expected(2, "spawn") in result.stderr.splitlines()
    assert "exited unexpectedly" not in result.stderr
    assert "batch" not in result.stdout


@pytest.mark.skipif("fork" not in multiprocessing.get_all_start_methods(), reason="no fork here")
@pytest.mark.parametrize("options", ["num_workers=2, multiprocessing_context='fork'", "num_workers=0"])
def test_the_same_dataset_loads_with_forked_workers_or_none(options):
    result = _run(options)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["batch", "4"]


class _Interactive:
    """Patches ``sys.modules['__main__']`` into an interactive one (no ``__file__``) holding classes."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.main = types.ModuleType("__main__")
        monkeypatch.setitem(sys.modules, "__main__", self.main)

    def define(self, value):
        value.__module__, value.__qualname__ = "__main__", value.__name__
        setattr(self.main, value.__qualname__, value)
        return value


class _Dataset(Dataset):
    def __len__(self):
        return LABELS.numel()

    def __getitem__(self, index):
        return index, LABELS[index]


def _main_dataset(interactive: _Interactive) -> Dataset:
    cls = interactive.define(type("NotebookDataset", (_Dataset,), {}))
    return cls()


@pytest.mark.parametrize("context", ["spawn", "forkserver", multiprocessing.get_context("spawn")])
def test_every_pickling_context_is_refused(monkeypatch, context):
    dataset = _main_dataset(_Interactive(monkeypatch))
    method = context if isinstance(context, str) else context.get_start_method()
    with pytest.raises(ValueError) as raised:
        build_dataloader(
            dataset, PKBatchSampler(LABELS, 2, 2), num_workers=2, multiprocessing_context=context
        )
    assert f"ValueError: {raised.value}" == _expected(2, method)
    assert "\n" not in str(raised.value)


def test_the_process_start_method_and_the_platform_default_are_read(monkeypatch):
    dataset = _main_dataset(_Interactive(monkeypatch))
    monkeypatch.setattr(torch.multiprocessing, "get_start_method", lambda allow_none=False: "spawn")
    assert worker_start_method() == "spawn"
    with pytest.raises(ValueError, match="the 2 'spawn' DataLoader worker"):
        build_dataloader(dataset, PKBatchSampler(LABELS, 2, 2), num_workers=2)
    monkeypatch.setattr(torch.multiprocessing, "get_start_method", lambda allow_none=False: None)
    monkeypatch.setattr(multiprocessing, "get_all_start_methods", lambda: ["forkserver", "fork", "spawn"])
    assert worker_start_method() == "forkserver"  # Python 3.14 on Linux
    with pytest.raises(ValueError, match="the 2 'forkserver' DataLoader worker"):
        build_dataloader(dataset, PKBatchSampler(LABELS, 2, 2), num_workers=2)
    monkeypatch.setattr(multiprocessing, "get_all_start_methods", lambda: ["fork", "spawn", "forkserver"])
    assert len(build_dataloader(dataset, PKBatchSampler(LABELS, 2, 2), num_workers=2)) == 4


def test_wrapped_datasets_and_collate_functions_of_main_are_refused(monkeypatch):
    interactive = _Interactive(monkeypatch)
    sampler = PKBatchSampler(LABELS, 2, 2)
    spawn = {"num_workers": 1, "multiprocessing_context": "spawn"}
    inner = _main_dataset(interactive)
    with pytest.raises(ValueError, match="the dataset's class NotebookDataset is defined"):
        build_dataloader(Subset(inner, range(16)), sampler, **spawn)
    with pytest.raises(ValueError, match="the dataset's class NotebookDataset is defined"):
        build_dataloader(
            ConcatDataset([TensorDataset(LABELS[:8]), Subset(inner, range(8))]), sampler, **spawn
        )

    def collate(items):
        return items

    interactive.define(collate)
    with pytest.raises(ValueError, match="the collate_fn function collate is defined"):
        build_dataloader(TensorDataset(LABELS), sampler, collate_fn=collate, **spawn)
    collate_class = interactive.define(type("Collate", (), {"__call__": lambda self, items: items}))
    with pytest.raises(ValueError, match="the collate_fn's class Collate is defined"):
        build_dataloader(TensorDataset(LABELS), sampler, collate_fn=collate_class(), **spawn)


def test_forked_or_no_workers_and_a_script_main_are_left_alone(monkeypatch):
    interactive = _Interactive(monkeypatch)
    dataset = _main_dataset(interactive)
    sampler = PKBatchSampler(LABELS, 2, 2)
    build_dataloader(dataset, sampler)
    build_dataloader(dataset, sampler, num_workers=0)
    if "fork" in multiprocessing.get_all_start_methods():
        build_dataloader(dataset, sampler, num_workers=2, multiprocessing_context="fork")
    interactive.main.__file__ = "train.py"  # a script: spawned workers re-import it
    build_dataloader(dataset, sampler, num_workers=2, multiprocessing_context="spawn")


def test_a_dataset_of_a_real_module_loads_with_spawned_workers(monkeypatch):
    monkeypatch.setitem(sys.modules, "__main__", types.ModuleType("__main__"))  # interactive, as a notebook
    data = TensorDataset(torch.arange(16), LABELS)
    loader = build_dataloader(
        data, PKBatchSampler(LABELS, 2, 2), num_workers=1, multiprocessing_context="spawn"
    )
    assert dataloader_module.worker_start_method(loader.multiprocessing_context) == "spawn"
    indices, labels = next(iter(loader))
    assert indices.numel() == 4 and torch.equal(labels, LABELS[indices])
