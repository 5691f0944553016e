"""What a run uses on its device unless the config says otherwise: precision, TF32, the train loader's workers.

:func:`device_defaults` is a pure function of the device type and its compute capability;
:func:`run_device` reads them off the config's ``trainer.device`` (Composer's choice when unset: a GPU
when CUDA is available) and this machine; :func:`fill_device_defaults` writes the defaults into the
config where it is silent, so the resolved ``config.yaml`` records them and an explicit value always
wins; :func:`apply_device_settings` sets the process-wide switches (TF32) once, before the model is
built. :func:`~composer_dynsample.config.run.build_run` does all four.

On a CUDA device of compute capability 8.0 or more (A100, H100, H200, RTX 30xx and later):
``trainer.precision: amp_bf16`` (bf16 autocast, no loss scaling), TF32 matrix products for what runs
in fp32, a train loader of 2 persistent workers that load 4 batches ahead each into pinned memory, and
text batches (and a transformer's groups of short and long rows) padded to a multiple of 8 tokens. On
an older GPU: Composer's own default precision there (``amp_fp16``) without TF32, and the same loader
and padding. On the CPU (and any other device): fp32, no workers and no padding, as before: the padding
changes no value, but dropout draws its masks over the padded shape, so a padded CPU run would train
on other masks than before. These GPU settings are chosen by what the hardware offers; their speed is
not measured in this repository (no GPU here).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from typing import Any

from omegaconf import DictConfig, OmegaConf

from composer_dynsample.config.components import COMPONENT_KEY, ConfigError, peek_entry

__all__ = [
    "CUDA_LOADER",
    "DeviceDefaults",
    "apply_device_settings",
    "device_defaults",
    "fill_device_defaults",
    "run_device",
]

#: The train loader's settings on a CUDA device: workers gather and pad the next batches (index-only:
#: the sampler stays in the main process) while the GPU runs this one, into pinned memory.
CUDA_LOADER: dict[str, Any] = {
    "num_workers": 2,
    "persistent_workers": True,
    "prefetch_factor": 4,
    "pin_memory": True,
}
#: The train loader's settings elsewhere: the ``dataloader`` section's defaults.
_HOST_LOADER: dict[str, Any] = {"num_workers": 0, "pin_memory": False}
#: Loader keys that PyTorch refuses without workers.
_WITH_WORKERS_ONLY = ("persistent_workers", "prefetch_factor")
#: The multiple a CUDA device's text batches are padded to: whole tiles of bf16 tensor cores (8 values).
CUDA_PAD_TO_MULTIPLE_OF = 8


@dataclasses.dataclass(frozen=True)
class DeviceDefaults:
    """What a run uses on a device where its config is silent (see :func:`device_defaults`).

    Attributes:
        device_type (str): ``"cuda"``, ``"cpu"``, or another torch device type.
        precision (str): Composer's ``trainer.precision``: ``"amp_bf16"``, ``"amp_fp16"`` or ``"fp32"``.
        tf32 (bool): Run fp32 matrix products and convolutions on TF32 tensor cores.
        dataloader (dict[str, Any]): ``dataloader`` keys of the train loader.
        pad_to_multiple_of (int | None): ``dataloader.pad_to_multiple_of`` and a transformer encoder's
            ``pad_to_multiple_of``; ``None``: pad to the longest row.
    """

    device_type: str
    precision: str
    tf32: bool
    dataloader: dict[str, Any]
    pad_to_multiple_of: int | None = None


def device_defaults(device_type: str, capability: tuple[int, int] | None = None) -> DeviceDefaults:
    """The settings a run takes on ``device_type`` unless its config sets them.

    bf16 autocast and TF32 need a GPU of compute capability 8.0 or more (Ampere); an older GPU keeps
    Composer's default precision on a GPU (``amp_fp16``, with loss scaling). Every CUDA device gets the
    worker loader of :data:`CUDA_LOADER` and padding to :data:`CUDA_PAD_TO_MULTIPLE_OF`; other devices
    keep fp32, no workers and no padding.

    Args:
        device_type (str): A torch device type: ``"cuda"``, ``"cpu"``, ``"mps"``, ...
        capability (tuple[int, int], optional): The CUDA device's compute capability ``(major, minor)``.
            Default: ``None`` (unknown: no bf16, no TF32).

    Returns:
        DeviceDefaults: The settings.

    Raises:
        TypeError: If ``device_type`` is not a string or ``capability`` not a pair of integers.

    Example:
        >>> device_defaults("cuda", (9, 0)).precision, device_defaults("cuda", (7, 0)).precision
        ('amp_bf16', 'amp_fp16')
        >>> cpu = device_defaults("cpu")
        >>> cpu.precision, cpu.tf32, cpu.dataloader["num_workers"], cpu.pad_to_multiple_of
        ('fp32', False, 0, None)
    """
    if not isinstance(device_type, str):
        raise TypeError(
            f"device_type must be a torch device type such as 'cuda' or 'cpu', got {device_type!r}."
        )
    if capability is not None and (
        not isinstance(capability, (tuple, list))
        or len(capability) != 2
        or not all(isinstance(part, int) and not isinstance(part, bool) for part in capability)
    ):
        raise TypeError(f"capability must be a (major, minor) pair of integers or None, got {capability!r}.")
    if device_type != "cuda":
        return DeviceDefaults(device_type, "fp32", False, dict(_HOST_LOADER))
    ampere = capability is not None and tuple(capability) >= (8, 0)
    precision = "amp_bf16" if ampere else "amp_fp16"
    return DeviceDefaults(device_type, precision, ampere, dict(CUDA_LOADER), CUDA_PAD_TO_MULTIPLE_OF)


def run_device(trainer: Mapping[str, Any]) -> tuple[str, tuple[int, int] | None]:
    """The torch device type a ``trainer`` section trains on, and the compute capability of a CUDA one.

    ``trainer.device`` as Composer reads it: unset is a GPU when CUDA is available, else the CPU;
    ``"gpu"`` is CUDA. The capability is this process's GPU's (``LOCAL_RANK``), ``None`` when CUDA is not
    available. Nothing else is decided here.

    Args:
        trainer (Mapping[str, Any]): The ``trainer`` section.

    Returns:
        tuple[str, tuple[int, int] | None]: The device type and the capability.
    """
    import torch

    device = trainer.get("device")
    if device is None:
        device_type = "cuda" if torch.cuda.is_available() else "cpu"
    elif isinstance(device, str):
        device_type = "cuda" if device.lower() == "gpu" else device.lower()
    else:  # a Device object: Composer checks it
        device_type = "cuda" if type(device).__name__ == "DeviceGPU" else "other"
    if device_type != "cuda" or not torch.cuda.is_available():
        return device_type, None
    index = int(os.environ.get("LOCAL_RANK", "0") or 0) % max(1, torch.cuda.device_count())
    major, minor = torch.cuda.get_device_capability(index)
    return device_type, (int(major), int(minor))


def fill_device_defaults(cfg: DictConfig, defaults: DeviceDefaults) -> dict[str, Any]:
    """Write ``defaults`` into ``cfg`` where it is silent; return what was written, by dotted key.

    ``trainer.precision`` always (so the resolved config records it); the ``dataloader`` keys unless the
    section names another loader class (``_component_``), and ``persistent_workers`` and
    ``prefetch_factor`` only when the loader has workers (PyTorch refuses them without); a padding
    multiple as ``dataloader.pad_to_multiple_of`` and as the ``pad_to_multiple_of`` of a transformer
    ``model.encoder`` (or of a two-tower encoder's transformer towers). A key the config sets, to null
    included, is kept.

    Args:
        cfg (DictConfig): The config, changed in place.
        defaults (DeviceDefaults): What :func:`device_defaults` chose.

    Returns:
        dict[str, Any]: The keys written and their values (``{}`` when the config set them all).

    Raises:
        ConfigError: If ``trainer`` or ``dataloader`` is not a mapping.

    Example:
        >>> cfg = OmegaConf.create({"trainer": {"max_duration": "1ep"}, "dataloader": {"num_workers": 0}})
        >>> fill_device_defaults(cfg, device_defaults("cuda", (9, 0)))
        {'trainer.precision': 'amp_bf16', 'dataloader.pin_memory': True, 'dataloader.pad_to_multiple_of': 8}
    """
    filled: dict[str, Any] = {}
    for name in ("trainer", "dataloader"):
        if cfg.get(name) is not None and not isinstance(cfg.get(name), Mapping):
            raise ConfigError(f"{name} must be a mapping of keys to values, got {cfg.get(name)!r}.")
    trainer = cfg.get("trainer")
    if trainer is None or "precision" not in trainer:
        filled["trainer.precision"] = defaults.precision
    loader = cfg.get("dataloader") or {}
    if COMPONENT_KEY not in loader:
        workers = loader.get("num_workers", defaults.dataloader.get("num_workers", 0))
        for key, value in defaults.dataloader.items():
            if key in loader or (key in _WITH_WORKERS_ONLY and not workers):
                continue
            filled[f"dataloader.{key}"] = value
    if defaults.pad_to_multiple_of is not None:
        if "pad_to_multiple_of" not in loader:
            filled["dataloader.pad_to_multiple_of"] = defaults.pad_to_multiple_of
        for path in _transformer_sections(cfg):
            filled[f"{path}.pad_to_multiple_of"] = defaults.pad_to_multiple_of
    for key, value in filled.items():
        OmegaConf.update(cfg, key, value, merge=True)
    return filled


def _transformer_sections(cfg: DictConfig) -> list[str]:
    """The encoder sections of ``cfg`` that build a transformer and leave ``pad_to_multiple_of`` out."""
    from composer_dynsample.config.model_checks import TOWERS, is_transformer
    from composer_dynsample.config.names import ENCODERS

    model = cfg.get("model")
    encoder = model.get("encoder") if isinstance(model, Mapping) else None
    if not isinstance(encoder, Mapping):
        return []
    candidates = {"model.encoder": encoder}
    candidates.update(
        {
            f"model.encoder.{tower}": encoder.get(tower)
            for tower in TOWERS
            if isinstance(encoder.get(tower), Mapping)
        }
    )
    found = []
    for path, values in candidates.items():
        plain = (
            dict(OmegaConf.to_container(values, resolve=True))
            if isinstance(values, DictConfig)
            else dict(values)
        )
        if "pad_to_multiple_of" in plain:
            continue
        try:
            target = peek_entry(path, plain, ENCODERS)
        except (ConfigError, ImportError):  # the model builder says what is wrong with the section
            continue
        if is_transformer(target):
            found.append(path)
    return found


def apply_device_settings(defaults: DeviceDefaults, precision: Any) -> bool:
    """Turn on TF32 for this process when ``defaults`` say so and the run's precision is not plain fp32.

    TF32 is a process-wide switch (``torch.backends.cuda.matmul.allow_tf32``, ``torch.backends.cudnn.
    allow_tf32`` and ``torch.set_float32_matmul_precision("high")``): it is set only for a CUDA device
    that has TF32 tensor cores, and never turned off. An explicit ``trainer.precision: fp32`` keeps fp32
    matrix products exact (no TF32); under ``amp_bf16`` it speeds up what autocast leaves in fp32.

    Args:
        defaults (DeviceDefaults): What :func:`device_defaults` chose.
        precision (Any): The run's ``trainer.precision`` (a string, a Composer ``Precision`` or ``None``).

    Returns:
        bool: Whether TF32 was turned on.
    """
    if not defaults.tf32 or str(getattr(precision, "value", precision)).lower() == "fp32":
        return False
    import torch

    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    torch.set_float32_matmul_precision("high")
    return True
