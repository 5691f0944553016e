"""Reading a config: YAML files, dotted overrides, and the sections with fixed keys as structured configs.

The sections that build objects (``data``, ``model``, ``sampler``, ``optimizer``, ...) take whatever
their target's signature takes. The sections with fixed keys, the run options (``seed``,
``run_dir``), ``evaluation`` and ``dataloader``, are OmegaConf structured configs: dataclasses whose
fields are the valid keys, with their types and defaults; :func:`structured` checks a section against
one and returns the dataclass. The dataclasses and :func:`structured` are defined in
:mod:`~composer_dynsample.config.section_schemas` and importable from here; :func:`run_options`,
:func:`evaluation_config` and :func:`dataloader_config` read their sections from a config.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml
from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from composer_dynsample.config.components import COMPONENT_KEY, ConfigError, check_keys
from composer_dynsample.config.overrides import as_flow, carried_keys, dropped_keys_note
from composer_dynsample.config.section_schemas import (
    DataloaderConfig,
    EvaluationConfig,
    RunOptions,
    structured,
)

__all__ = [
    "SECTIONS",
    "DataloaderConfig",
    "EvaluationConfig",
    "RunOptions",
    "collate_padding",
    "default_run_dir",
    "expand_trainer_paths",
    "load_config",
    "plain",
    "save_config",
    "section",
    "structured",
]

#: The top-level sections.
SECTIONS: tuple[str, ...] = (
    "seed",
    "run_dir",
    "resume_on_changed_data",
    "data",
    "model",
    "sampler",
    "dataloader",
    "algorithms",
    "callbacks",
    "optimizer",
    "scheduler",
    "evaluation",
    "trainer",
    "loggers",
)
REQUIRED_SECTIONS = ("data", "model", "sampler", "optimizer", "trainer")


def load_config(
    config: str | os.PathLike[str] | Mapping[str, Any] | DictConfig,
    overrides: Sequence[str] = (),
    *,
    note: Callable[[str], None] | None = None,
) -> DictConfig:
    """Load a YAML config (or take a mapping) and apply dotted ``key.path=value`` overrides.

    Args:
        config (str | os.PathLike | Mapping | DictConfig): A YAML file, or the config itself.
        overrides (Sequence[str]): Items such as ``trainer.max_duration=2ep`` or ``evaluation.ks=[1,10]``,
            parsed by ``OmegaConf.from_dotlist`` and merged over the file in order; a mapping such as
            ``model.loss={_component_: my.Loss, scale: 2}`` replaces the whole section. Default: none.
        note (Callable[[str], None], optional): Called with one line for each mapping override that
            leaves out keys the section had, when the mapping names the same component (or none): the
            keys, their values and how to keep them
            (:func:`~composer_dynsample.config.overrides.dropped_keys_note`). Default: ``None``.

    Returns:
        DictConfig: The merged config, with interpolations resolved and its top-level sections checked.

    Raises:
        FileNotFoundError: If the file does not exist.
        ConfigError: If the YAML or an override is malformed, or a top-level key is unknown.

    Example:
        >>> minimal = {
        ...     "data": {"name": "digits"},
        ...     "model": {"encoder": {"name": "mlp"}},
        ...     "sampler": {"name": "pk", "classes_per_batch": 4, "samples_per_class": 4},
        ...     "optimizer": {"name": "adam"},
        ...     "trainer": {"max_duration": "2ep"},
        ... }
        >>> cfg = load_config(minimal, ["trainer.max_duration=3ep", "seed=1"])
        >>> cfg.trainer.max_duration, cfg.seed
        ('3ep', 1)
    """
    base = _read(config)
    bad = [item for item in overrides if not isinstance(item, str) or "=" not in item or item.startswith("=")]
    if bad:
        raise ConfigError(
            f"override {bad[0]!r} is not of the form key.path=value (e.g. trainer.max_duration=2ep)."
        )
    try:
        for item in overrides:
            _apply(base, item, note)
        container = OmegaConf.to_container(base, resolve=True)
    except OmegaConfBaseException as error:
        raise ConfigError(f"cannot apply the overrides {list(overrides)}: {error}") from error
    _check_int_range(container, "")
    cfg = OmegaConf.create(container)
    check_keys("the config", {key: None for key in cfg}, list(SECTIONS), "the top level")
    missing = [key for key in REQUIRED_SECTIONS if cfg.get(key) is None]
    if missing:
        raise ConfigError(
            f"the config has no {missing[0]!r} section; required sections: {list(REQUIRED_SECTIONS)}."
        )
    return cfg


def _apply(cfg: DictConfig, override: str, note: Callable[[str], None] | None = None) -> None:
    """Apply one ``key.path=value``: a mapping value replaces the section, any other value is merged in.

    ``model.encoder={_component_: my_models.MyEncoder}`` therefore starts the section afresh (the file's
    keys belonged to the encoder it named), while ``model.encoder.embedding_dim=32`` changes one key.
    ``note`` is called with the line of :func:`~composer_dynsample.config.overrides.dropped_keys_note`.
    """
    key = override.split("=", 1)[0].strip()
    try:
        value = OmegaConf.select(OmegaConf.from_dotlist([override]), key)
    except yaml.YAMLError as error:
        problem = " ".join(
            str(part) for part in (getattr(error, "context", None), getattr(error, "problem", None)) if part
        )
        raise ConfigError(
            f"override {override!r}: the value is not valid YAML ({problem or type(error).__name__}); "
            "close its brackets and quotes, or quote it whole (e.g. key='a{b')."
        ) from None
    if isinstance(value, DictConfig):
        line = dropped_keys_note(cfg, key, value) if note is not None else None
        carried = carried_keys(cfg, key, value)
        if carried:
            value = OmegaConf.merge(value, carried)
            settings = ", ".join(f"{name}: {as_flow(item)}" for name, item in carried.items())
            line = (
                f"note: {key}={{...}} replaced the {key} section; {settings} carried over from it, as every "
                f"text loader takes {'it' if len(carried) == 1 else 'them'} (set {key}.NAME=... after it to change)"
            )
        OmegaConf.update(cfg, key, value, merge=False)
        if line is not None and note is not None:
            note(line)
    else:
        cfg.merge_with(OmegaConf.from_dotlist([override]))


#: The integers a config may hold: numpy's and torch's int64, which every size and seed ends up in.
INT64_RANGE = (-(2**63), 2**63 - 1)


def _check_int_range(value: Any, path: str) -> None:
    """Refuse an integer outside int64 anywhere in the config, naming its key (numpy would overflow later)."""
    if isinstance(value, Mapping):
        for key, item in value.items():
            _check_int_range(item, f"{path}.{key}" if path else str(key))
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            _check_int_range(item, f"{path}[{index}]")
    elif (
        isinstance(value, int)
        and not isinstance(value, bool)
        and not INT64_RANGE[0] <= value <= INT64_RANGE[1]
    ):
        raise ConfigError(
            f"{path} must be an integer in [-2**63, 2**63 - 1] (64 bits), got {value}; sizes, counts and seeds "
            "are far smaller."
        )


def _read(config: str | os.PathLike[str] | Mapping[str, Any] | DictConfig) -> DictConfig:
    if isinstance(config, DictConfig):
        return config.copy()
    if isinstance(config, Mapping):
        return OmegaConf.create(dict(config))
    path = Path(config).expanduser()
    if not path.is_file():
        raise FileNotFoundError(f"config file {str(path)!r} does not exist.")
    try:
        base = OmegaConf.load(path)
    except (OmegaConfBaseException, yaml.YAMLError, UnicodeDecodeError) as error:
        raise ConfigError(f"{path}: not a valid YAML config: {error}") from error
    if not isinstance(base, DictConfig):
        raise ConfigError(f"{path}: a config must be a YAML mapping of sections, got a list.")
    return base


def default_run_dir(config_path: str | os.PathLike[str] | None) -> Path:
    """``runs/<config file stem>`` (``runs/default`` without a file)."""
    return Path("runs") / (Path(config_path).stem if config_path is not None else "default")


def expand_trainer_paths(trainer: Any) -> None:
    """Expand ``~`` in a local ``load_path`` and ``save_folder`` of a trainer section, in place.

    Composer takes ``~`` literally, while the checks (``Path.expanduser``) do not: expanding it once here
    makes the path checked the path loaded or written.
    """
    for key in ("load_path", "save_folder"):
        value = trainer.get(key)
        if isinstance(value, str) and "://" not in value:
            trainer[key] = os.path.expanduser(value)


def save_config(cfg: DictConfig, path: str | os.PathLike[str]) -> None:
    """Write the resolved config as YAML (what ``composer-dynsample train`` saves as ``config.yaml``)."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    OmegaConf.save(cfg, Path(path), resolve=True)


def plain(value: Any) -> Any:
    """An OmegaConf node as plain Python containers."""
    if isinstance(value, (DictConfig, ListConfig)):
        return OmegaConf.to_container(value, resolve=True)
    return value


def section(cfg: DictConfig | Mapping[str, Any], key: str, path: str) -> dict[str, Any]:
    """``cfg[key]`` as a dict (``{}`` when absent or null), or a ConfigError if it is not a mapping."""
    value = plain(cfg.get(key)) if key in cfg else None
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ConfigError(f"{path} must be a mapping of keys to values, got {value!r}.")
    return dict(value)


def run_options(cfg: DictConfig) -> RunOptions:
    """The validated top-level ``seed``, ``run_dir`` and ``resume_on_changed_data``."""
    keys = ("seed", "run_dir", "resume_on_changed_data")
    values = {key: plain(cfg[key]) for key in keys if key in cfg and cfg[key] is not None}
    return structured("the config", values, RunOptions)


def evaluation_config(cfg: DictConfig) -> EvaluationConfig:
    """The validated ``evaluation`` section (a bare integer ``K`` counts as ``[K]``)."""
    values = section(cfg, "evaluation", "evaluation")
    if isinstance(values.get("ks"), int):
        values["ks"] = [values["ks"]]
    return structured("evaluation", values, EvaluationConfig)


def dataloader_config(cfg: DictConfig) -> tuple[str | None, dict[str, Any]]:
    """The ``dataloader`` section: its ``_component_`` (or ``None``) and the keyword arguments the user set.

    Without a ``_component_`` the keys are checked against :class:`DataloaderConfig`; ``pin_memory``
    defaults to whether CUDA is available. ``pad_to_multiple_of`` is the collate's, not the loader's:
    see :func:`collate_padding`.
    """
    values = section(cfg, "dataloader", "dataloader")
    component = values.pop(COMPONENT_KEY, None)
    collate_padding(cfg)  # checked with a _component_ too
    values.pop("pad_to_multiple_of", None)
    if component is None:
        checked = dataclasses.asdict(structured("dataloader", values, DataloaderConfig))
        values = {key: checked[key] for key in values}
        if values.get("pin_memory") is None:
            import torch

            values["pin_memory"] = torch.cuda.is_available()
    return component, values


def collate_padding(cfg: DictConfig) -> int | None:
    """``dataloader.pad_to_multiple_of``: the multiple the train collate pads a text batch's length to.

    Returns:
        int | None: The multiple; ``None`` for null, ``1`` or unset (the longest row).

    Raises:
        ConfigError: If the value is not null or an integer >= 1.

    Example:
        >>> collate_padding(OmegaConf.create({"dataloader": {"pad_to_multiple_of": 8}}))
        8
        >>> collate_padding(OmegaConf.create({})), collate_padding(OmegaConf.create({"dataloader": {"pad_to_multiple_of": 1}}))
        (None, None)
    """
    values = section(cfg, "dataloader", "dataloader")
    value = values.get("pad_to_multiple_of", DataloaderConfig.pad_to_multiple_of)
    checked = structured("dataloader", {"pad_to_multiple_of": value}, DataloaderConfig).pad_to_multiple_of
    return None if checked in (None, 1) else checked
