"""The device's defaults: amp_bf16, TF32, loader workers and padding on a CUDA device of compute capability 8+;
today's fp32, no workers, no padding on the CPU; a key the config sets always wins; what was filled is in
the resolved config, ``config.yaml`` and ``metrics.json``. No GPU here: CUDA is a device type and capability
given to pure functions, and the run's view of its device is patched."""

from __future__ import annotations

import json

import pytest
import torch
from omegaconf import OmegaConf

from composer_dynsample.cli.main import main
from composer_dynsample.config import load_config
from composer_dynsample.config import run as run_module
from composer_dynsample.config.builders import build_data, build_train_dataloader
from composer_dynsample.config.components import ConfigError
from composer_dynsample.config.device import (
    CUDA_LOADER,
    apply_device_settings,
    device_defaults,
    fill_device_defaults,
    run_device,
)
from composer_dynsample.config.run import build_run
from tests.cli.helpers import BAG, pairs_data, write_pairs, write_run_config

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

H200 = (9, 0)


def _config(**sections: object) -> OmegaConf:
    return OmegaConf.create({"trainer": {"max_duration": "1ep"}, **sections})


@pytest.fixture
def tf32_restored():
    """TF32 is a process-wide switch: put it back as it was after the test."""
    saved = (
        torch.backends.cuda.matmul.allow_tf32,
        torch.backends.cudnn.allow_tf32,
        torch.get_float32_matmul_precision(),
    )
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved[:2]
    torch.set_float32_matmul_precision(saved[2])


def test_a_cuda_device_with_bf16_gets_amp_bf16_tf32_workers_pinning_and_padding():
    defaults = device_defaults("cuda", H200)
    assert (defaults.precision, defaults.tf32, defaults.pad_to_multiple_of) == ("amp_bf16", True, 8)
    assert defaults.dataloader == {
        "num_workers": 2,
        "persistent_workers": True,
        "prefetch_factor": 4,
        "pin_memory": True,
    }
    assert device_defaults("cuda", (8, 0)).precision == "amp_bf16"


@pytest.mark.parametrize("capability", [(7, 5), (7, 0), None])
def test_a_cuda_device_without_bf16_keeps_composer_s_gpu_default(capability):
    defaults = device_defaults("cuda", capability)
    assert (defaults.precision, defaults.tf32) == ("amp_fp16", False)  # Composer's default on a GPU
    assert defaults.dataloader == CUDA_LOADER and defaults.pad_to_multiple_of == 8


@pytest.mark.parametrize("device_type", ["cpu", "mps"])
def test_other_devices_keep_today_s_values(device_type):
    defaults = device_defaults(device_type)
    assert (defaults.precision, defaults.tf32, defaults.pad_to_multiple_of) == ("fp32", False, None)
    assert defaults.dataloader == {"num_workers": 0, "pin_memory": False}


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (("gpu0",), None),
        ((None,), "device_type must be a torch device type"),
        (("cuda", (9,)), r"capability must be a \(major, minor\) pair"),
        (("cuda", ("9", "0")), r"capability must be a \(major, minor\) pair"),
    ],
)
def test_device_defaults_checks_its_arguments(arguments, message):
    if message is None:
        assert device_defaults(*arguments).precision == "fp32"  # an unknown type is not CUDA
        return
    with pytest.raises(TypeError, match=message):
        device_defaults(*arguments)


def test_cuda_defaults_fill_what_the_config_leaves_out():
    cfg = _config(model={"encoder": {"name": "transformer", "config": {"model_type": "bert"}}})
    filled = fill_device_defaults(cfg, device_defaults("cuda", H200))
    assert filled == {
        "trainer.precision": "amp_bf16",
        "dataloader.num_workers": 2,
        "dataloader.persistent_workers": True,
        "dataloader.prefetch_factor": 4,
        "dataloader.pin_memory": True,
        "dataloader.pad_to_multiple_of": 8,
        "model.encoder.pad_to_multiple_of": 8,
    }
    assert cfg.trainer.precision == "amp_bf16" and cfg.dataloader.num_workers == 2
    assert cfg.model.encoder.pad_to_multiple_of == 8 and cfg.trainer.max_duration == "1ep"


def test_explicit_values_win():
    cfg = _config(
        trainer={"max_duration": "1ep", "precision": "fp32"},
        dataloader={"num_workers": 0, "pad_to_multiple_of": None},
        model={"encoder": {"name": "transformer", "path": "x", "pad_to_multiple_of": 1}},
    )
    filled = fill_device_defaults(cfg, device_defaults("cuda", H200))
    # persistent_workers and prefetch_factor need workers: PyTorch refuses them with num_workers 0.
    assert filled == {"dataloader.pin_memory": True}
    assert cfg.trainer.precision == "fp32" and cfg.dataloader.num_workers == 0
    assert cfg.dataloader.pad_to_multiple_of is None and cfg.model.encoder.pad_to_multiple_of == 1


def test_another_loader_class_and_other_encoders_get_no_keys_they_may_not_take():
    cfg = _config(
        dataloader={"_component_": "my.Loader"},
        model={
            "encoder": {"name": "two_tower", "query_encoder": BAG, "passage_encoder": {"name": "transformer"}}
        },
    )
    filled = fill_device_defaults(cfg, device_defaults("cuda", H200))
    assert filled == {
        "trainer.precision": "amp_bf16",
        "dataloader.pad_to_multiple_of": 8,  # the collate's, whatever the loader class
        "model.encoder.passage_encoder.pad_to_multiple_of": 8,
    }


def test_cpu_defaults_fill_today_s_values():
    cfg = _config(model={"encoder": {"name": "transformer", "config": {"model_type": "bert"}}})
    filled = fill_device_defaults(cfg, device_defaults("cpu"))
    assert filled == {
        "trainer.precision": "fp32",
        "dataloader.num_workers": 0,
        "dataloader.pin_memory": False,
    }
    assert "pad_to_multiple_of" not in cfg.model.encoder


def test_a_section_that_is_not_a_mapping_is_refused():
    with pytest.raises(ConfigError, match="dataloader must be a mapping of keys to values, got 3"):
        fill_device_defaults(_config(dataloader=3), device_defaults("cpu"))


def test_tf32_is_set_only_for_a_cuda_device_that_has_it_and_not_for_explicit_fp32(tf32_restored):
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    assert not apply_device_settings(device_defaults("cpu"), "fp32")
    assert not apply_device_settings(device_defaults("cuda", (7, 5)), "amp_fp16")
    assert not apply_device_settings(device_defaults("cuda", H200), "fp32")
    assert not torch.backends.cuda.matmul.allow_tf32 and torch.get_float32_matmul_precision() == "highest"
    assert apply_device_settings(device_defaults("cuda", H200), "amp_bf16")
    assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32
    assert torch.get_float32_matmul_precision() == "high"


def test_run_device_reads_trainer_device_as_composer_does(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert run_device({}) == ("cpu", None)
    assert run_device({"device": "cpu"}) == ("cpu", None)
    assert run_device({"device": "gpu"}) == ("cuda", None)  # Composer refuses it here, in one line
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index: {0: (9, 0), 1: (8, 6)}[index])
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert run_device({}) == ("cuda", (8, 6))
    assert run_device({"device": "cpu"}) == ("cpu", None)


def _pairs_config(folder, **sections: object) -> str:
    write_pairs(folder)
    model = {"normalize": True, "encoder": BAG, "loss": {"name": "info_nce", "temperature": 0.1}}
    sampler = {"name": "pk", "classes_per_batch": 8, "samples_per_class": 2}
    return write_run_config(
        folder / "pairs.yaml",
        data=pairs_data(folder),
        model=model,
        sampler=sampler,
        ks=[1, 5],
        max_duration="2ba",
        **sections,
    )


def test_a_cpu_run_records_fp32_and_keeps_its_loader_and_batches(tmp_path):
    run = build_run(load_config(_pairs_config(tmp_path)), tmp_path / "run")
    assert run.config.trainer.precision == "fp32" and run.trainer.state.precision.value == "fp32"
    assert run.device_defaults == {
        "trainer.precision": "fp32",
        "dataloader.num_workers": 0,
        "dataloader.pin_memory": False,
        "tf32": False,
    }
    loader = run.train_dataloader
    assert loader.num_workers == 0 and not loader.pin_memory and loader.collate_fn.pad_to_multiple_of is None
    batch = next(iter(loader))
    assert batch["features"]["attention_mask"].sum(dim=1).max() == batch["features"]["input_ids"].shape[1]


def test_a_cuda_device_s_defaults_reach_the_loader_and_the_collate(tmp_path, monkeypatch, tf32_restored):
    monkeypatch.setattr(run_module, "run_device", lambda trainer: ("cuda", H200))
    cfg = load_config(_pairs_config(tmp_path))
    settings = run_module._device_settings(cfg)
    assert settings["tf32"] and settings["trainer.precision"] == "amp_bf16"
    assert torch.backends.cuda.matmul.allow_tf32
    loader = build_train_dataloader(cfg, build_data(cfg).train, seed=0)
    assert (loader.num_workers, loader.pin_memory, loader.persistent_workers, loader.prefetch_factor) == (
        2,
        True,
        True,
        4,
    )
    assert loader.collate_fn.pad_to_multiple_of == 8
    assert next(iter(loader))["features"]["input_ids"].shape[1] % 8 == 0


def test_an_explicit_padding_pads_a_cpu_run_too(tmp_path):
    config = _pairs_config(tmp_path)
    run = build_run(load_config(config, ["dataloader.pad_to_multiple_of=8"]), tmp_path / "run")
    assert next(iter(run.train_dataloader))["features"]["input_ids"].shape[1] % 8 == 0
    with pytest.raises(ConfigError, match=r"dataloader\.pad_to_multiple_of must be an integer >= 1, got 0"):
        build_run(load_config(config, ["dataloader.pad_to_multiple_of=0"]), tmp_path / "bad")


def test_config_yaml_and_metrics_json_record_the_precision(tmp_path):
    main(["train", _pairs_config(tmp_path), "--quiet", "--run-dir", str(tmp_path / "run")])
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["precision"] == "fp32"
    assert (
        metrics["device_defaults"]["trainer.precision"] == "fp32"
        and metrics["device_defaults"]["tf32"] is False
    )
    assert OmegaConf.load(tmp_path / "run" / "config.yaml").trainer.precision == "fp32"
