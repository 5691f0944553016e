"""``_component_`` in every section: the user's own module and a PML loss train through the command line."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from composer_dynsample.cli.main import main
from composer_dynsample.config import ConfigError, build_run, load_config

ROOT = Path(__file__).resolve().parents[2]
DIGITS = str(ROOT / "yamls" / "digits_quick.yaml")
QUIET = ["trainer.progress_bar=false", "evaluation.interval=null"]

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

# A module outside the package, as a user writes it next to their config.
USER_MODULE = textwrap.dedent(
    """
    import torch
    from composer.core import Algorithm, Callback, Event

    from composer_dynsample import PKBatchSampler
    from composer_dynsample.samplers.dataloader import BatchSamplerDataLoader

    USED = {}


    class TinyEncoder(torch.nn.Module):
        def __init__(self, in_features, width=16, embedding_dim=8):
            super().__init__()
            USED["encoder"] = dict(in_features=in_features, width=width, embedding_dim=embedding_dim)
            self.net = torch.nn.Sequential(
                torch.nn.Linear(in_features, width), torch.nn.ReLU(), torch.nn.Linear(width, embedding_dim)
            )

        def forward(self, x):
            return self.net(x)


    class MarginLoss(torch.nn.Module):
        def __init__(self, margin=0.1):
            super().__init__()
            USED["loss"] = margin
            self.margin = margin

        def forward(self, embeddings, labels, indices_tuple=None, ref_emb=None, ref_labels=None):
            same = labels[:, None] == labels[None, :]
            distances = torch.cdist(embeddings, embeddings)
            return torch.relu(distances[same].mean() - distances[~same].mean() + self.margin)


    class MySampler(PKBatchSampler):
        def __init__(self, labels, classes_per_batch, samples_per_class, *, seed=0, tag="x", **kwargs):
            USED["sampler"] = dict(tag=tag, seed=seed)
            super().__init__(labels, classes_per_batch, samples_per_class, seed=seed, **kwargs)


    class MyLoader(BatchSamplerDataLoader):
        def __init__(self, dataset, batch_sampler, *, label="loader", **kwargs):
            USED["dataloader"] = label
            super().__init__(dataset, batch_sampler, **kwargs)


    def flat(warmup=0.0):
        USED["scheduler"] = warmup
        return lambda state, ssr=1.0: 1.0


    class CountBatches(Algorithm):
        def __init__(self, every=1):
            self.every, self.seen = every, 0

        def match(self, event, state):
            return event == Event.AFTER_DATALOADER

        def apply(self, event, state, logger):
            self.seen += 1
            USED["algorithm"] = self.seen


    class Recorder(Callback):
        def __init__(self, prefix="rec"):
            self.prefix = prefix

        def fit_end(self, state, logger):
            USED["callback"] = self.prefix
    """
)


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    (tmp_path / "my_models.py").write_text(USER_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("my_models", None)
    yield __import__("my_models")
    sys.modules.pop("my_models", None)


EVERY_SECTION = [
    "model.encoder={_component_: my_models.TinyEncoder, width: 24, embedding_dim: 12}",
    "model.loss={_component_: my_models.MarginLoss, margin: 0.3}",
    "sampler={_component_: my_models.MySampler, classes_per_batch: 4, samples_per_class: 4, tag: mine}",
    "dataloader={_component_: my_models.MyLoader, label: custom, num_workers: 0}",
    "optimizer={_component_: torch.optim.SGD, lr: 0.05, momentum: 0.9}",
    "scheduler={_component_: my_models.flat, warmup: 0.5}",
    "algorithms.count={_component_: my_models.CountBatches, every: 2}",
    "callbacks.record={_component_: my_models.Recorder, prefix: done}",
    "loggers.memory={_component_: composer.loggers.InMemoryLogger}",
]


def test_every_section_takes_a_component_from_the_users_module(user_module, tmp_path):
    main(
        [
            "train",
            DIGITS,
            *QUIET,
            "trainer.max_duration=3ba",
            *EVERY_SECTION,
            "--run-dir",
            str(tmp_path / "run"),
        ]
    )
    used = user_module.USED
    assert used["encoder"] == {"in_features": 64, "width": 24, "embedding_dim": 12}  # in_features inferred
    assert used["loss"] == 0.3 and used["dataloader"] == "custom" and used["scheduler"] == 0.5
    assert used["sampler"] == {"tag": "mine", "seed": 0}  # the top-level seed reaches a user's sampler
    assert used["algorithm"] == 3 and used["callback"] == "done"
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["batches"] == 3


def test_the_run_is_built_from_the_components(user_module, tmp_path):
    run = build_run(load_config(DIGITS, [*QUIET, *EVERY_SECTION]), tmp_path / "run")
    assert type(run.model.encoder).__name__ == "TinyEncoder"
    assert type(run.train_dataloader).__name__ == "MyLoader" and run.train_dataloader.batch_size == 16
    assert isinstance(run.trainer.state.optimizers[0], torch.optim.SGD)
    names = {type(logger).__name__ for logger in run.trainer.logger.destinations}
    assert "InMemoryLogger" in names


def test_a_pml_loss_with_parameters_trains_through_the_command_line(tmp_path):
    pytest.importorskip("pytorch_metric_learning")
    overrides = [
        "model.loss={_component_: pytorch_metric_learning.losses.ArcFaceLoss, num_classes: 10, embedding_size: 32}",
        "algorithms.hard_negative_mining=null",
        "trainer.max_duration=2ep",
    ]
    run = build_run(load_config(DIGITS, [*QUIET, *overrides]), tmp_path / "built")
    weights = run.model.loss_fn.W
    assert any(
        weights is p for group in run.trainer.state.optimizers[0].param_groups for p in group["params"]
    )
    before = weights.detach().clone()
    run.trainer.fit()
    assert not torch.equal(before, weights.detach())  # the loss's own parameters train
    main(["train", DIGITS, *QUIET, *overrides, "--run-dir", str(tmp_path / "cli")])
    metrics = json.loads((tmp_path / "cli" / "metrics.json").read_text())
    assert metrics["recall_at_1"] > 0.5  # chance is 0.1


def test_pythonpath_brings_the_users_module_to_the_command(tmp_path):
    (tmp_path / "my_models.py").write_text(USER_MODULE)
    command = [
        sys.executable, "-m", "composer_dynsample", "train", DIGITS, *QUIET, "trainer.max_duration=1ba",
        "model.encoder._component_=my_models.TinyEncoder",
        "--run-dir", str(tmp_path / "run"),
    ]  # fmt: skip
    env = {**__import__("os").environ, "PYTHONPATH": str(tmp_path), "OMP_NUM_THREADS": "1"}
    result = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    # digits_quick's encoder is named 'mlp': a dotted _component_ beside it is ambiguous, said in one line.
    assert result.returncode == 2, result.stderr[-2000:]
    assert "model.encoder: give either 'name' ('mlp') or '_component_'" in result.stderr
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1
    command[command.index("model.encoder._component_=my_models.TinyEncoder")] = (
        "model.encoder={_component_: my_models.TinyEncoder, embedding_dim: 4}"  # a whole section replaces
    )
    result = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert json.loads((tmp_path / "run" / "metrics.json").read_text())["batches"] == 1


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        (
            ["model.encoder={_component_: no_such_module.Encoder}"],
            r"cannot import 'no_such_module'.*PYTHONPATH",
        ),
        (
            ["model.encoder={_component_: torch.nn.NoSuchLayer}"],
            r"module 'torch.nn' has no class or function",
        ),
        (["model.encoder={_component_: notdotted}"], "must be a dotted import path such as"),
        (["model.loss._component_=mlp"], r"either 'name' \('triplet_margin'\) or '_component_' \('mlp'\)"),
        (["model.encoder={_component_: my.Enc, name: mlp}"], "model.encoder={_component_: my.Enc, ...}"),
        (["optimizer.lr=fast"], r"optimizer.lr must be a number, got 'fast' \(a string\)"),
        (["sampler.classes_per_batch=2.5"], r"sampler.classes_per_batch must be an integer, got 2.5"),
        (["model.normalize=1"], r"model.normalize must be true or false, got 1 \(an integer\)"),
        (["optimizer.weight_decy=0.1"], r"unknown key 'weight_decy'.*Did you mean 'weight_decay'\?"),
        (["optimizer.name=adamm"], r"unknown name 'adamm'.*Did you mean 'adam'"),
        (["trainer.max_duraton=2ep"], r"Did you mean 'max_duration'\?"),
        (["evaluation.batch_size=big"], r"evaluation.batch_size must be of type int, got 'big'"),
        (["evaluation.kss=[1]"], r"unknown key 'kss'.*Did you mean 'ks'\?"),
        (["dataloader.num_worker=2"], r"Did you mean 'num_workers'\?"),
        (["loggers.wandb={}"], r"loggers.wandb: WandBLogger needs a package that is not installed: .*wandb"),
        (["callbacks.x={_component_: composer.callbacks.LRMonitor, every: 1}"], "unknown key 'every'"),
    ],
)
def test_component_and_type_errors_are_one_line_and_name_the_key(tmp_path, overrides, match):
    if overrides == ["loggers.wandb={}"]:
        pytest.importorskip("composer")
        if __import__("importlib").util.find_spec("wandb") is not None:
            pytest.skip("wandb is installed here")
    with pytest.raises(ConfigError, match=match) as error:
        build_run(load_config(DIGITS, [*QUIET, *overrides]), tmp_path / "run")
    assert "\n" not in str(error.value)
