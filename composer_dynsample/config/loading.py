"""Reading a config: YAML files, dotted overrides, and the sections with fixed keys as structured configs.

The sections that build objects (``data``, ``model``, ``sampler``, ``optimizer``, ...) take whatever
their target's signature takes. The sections with fixed keys, the run options (``seed``,
``run_dir``), ``evaluation`` and ``dataloader``, are OmegaConf structured configs: dataclasses whose
fields are the valid keys, with their types and defaults; :func:`structured` checks a section against
one and returns the dataclass.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, TypeVar

import yaml
from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from composer_dynsample.config.components import COMPONENT_KEY, ConfigError, check_keys
from composer_dynsample.config.overrides import as_flow, carried_keys, dropped_keys_note
from composer_dynsample.validation import check_choice, check_int, check_time

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

# Optional[...] rather than `X | None`: OmegaConf reads these annotations at run time.


@dataclass
class RunOptions:
    """The top-level run options.

    Attributes:
        seed (int): Seeds every random generator, the sampler's order included; in ``[0, 2**32 - 1]``
            (numpy's range). Default: ``0``.
        run_dir (str, optional): The output directory; ``--run-dir`` overrides it. Default:
            ``runs/<config file stem>``.
        resume_on_changed_data (bool): Resume from a checkpoint trained on other data than the config's
            (see :class:`~composer_dynsample.config.run.DataIdentity`). Default: ``False`` (refused).
    """

    seed: int = 0
    run_dir: Optional[str] = None  # noqa: UP045
    resume_on_changed_data: bool = False

    def __post_init__(self) -> None:
        _checked("seed", lambda: check_int("seed", self.seed, minimum=0, maximum=2**32 - 1))


@dataclass
class EvaluationConfig:
    """The ``evaluation`` section: retrieval of the test queries against the train gallery.

    Attributes:
        interval (str, optional): A Composer time string greater than zero (``"1ep"``, ``"200ba"``; a
            bare integer counts epochs), or null: evaluate only once, after training. Default: ``"1ep"``.
        ks (list[int]): The ``K`` of Recall@K, distinct integers >= 1. Default: ``[1, 5]``.
        distance (str): ``"cosine"`` or ``"euclidean"``. Default: ``"cosine"``.
        batch_size (int): Queries per evaluation batch. Default: ``1000``.
        gallery_batch_size (int): Gallery items embedded per forward pass. Default: ``2048``.
        at_start (bool): ``train`` also scores the starting model (before the first step, by the same
            protocol as at the end) and reports it beside the final metrics, under ``at_start`` in
            ``metrics.json``; a resumed run does not score it again. Default: ``False``.
        matryoshka_dims (list[int], optional): Also report every metric on the embeddings truncated to
            each of these dimensions (strictly descending) and L2-normalised again, under ``matryoshka`` in
            the results; a dimension equal to the embeddings' width is the full result. Default: null,
            ``model.loss.matryoshka_dims`` when the loss trains them, else none.
    """

    interval: Any = "1ep"
    ks: list[int] = field(default_factory=lambda: [1, 5])
    distance: str = "cosine"
    batch_size: int = 1000
    gallery_batch_size: int = 2048
    at_start: bool = False
    matryoshka_dims: Optional[list[int]] = None  # noqa: UP045

    def __post_init__(self) -> None:
        if self.matryoshka_dims is not None:  # the check is the loss's (it imports torch: only when set)
            from composer_dynsample.losses.matryoshka import check_matryoshka_dims

            key = "evaluation.matryoshka_dims"
            self.matryoshka_dims = list(
                _checked(key, lambda: check_matryoshka_dims(self.matryoshka_dims, key))
            )
        ks = list(self.ks)
        if not ks or any(k < 1 for k in ks) or len(set(ks)) != len(ks):
            raise ConfigError(f"evaluation.ks must be a list of distinct integers >= 1, got {ks!r}.")
        self.ks = ks
        if self.distance not in ("cosine", "euclidean"):
            raise ConfigError(f"evaluation.distance must be 'cosine' or 'euclidean', got {self.distance!r}.")
        for key in ("batch_size", "gallery_batch_size"):
            _checked(
                f"evaluation.{key}",
                lambda key=key: check_int(f"evaluation.{key}", getattr(self, key), minimum=1),
            )
        if self.interval is not None:
            if isinstance(self.interval, int) and not isinstance(self.interval, bool):
                self.interval = f"{self.interval}ep"  # a bare integer counts epochs, as elsewhere
            number, _ = _checked(
                "evaluation.interval", lambda: check_time("evaluation.interval", self.interval, ("ep", "ba"))
            )
            if number == 0:
                raise ConfigError(
                    f"evaluation.interval must be greater than zero, got {self.interval!r} (null evaluates "
                    "only once, after training)."
                )


@dataclass
class DataloaderConfig:
    """The ``dataloader`` section: ``DataLoader`` arguments of the train loader that the sampler does not own.

    ``batch_size``, ``shuffle``, ``sampler``, ``batch_sampler``, ``drop_last`` and ``collate_fn`` come
    from the sampler and the data. A ``_component_`` names another loader class, called as
    ``loader(dataset, batch_sampler, collate_fn=..., **keys)``; its keys are then checked against it
    (``pad_to_multiple_of`` excepted: it is the collate's). On a CUDA device a run fills the keys its
    config leaves out with :func:`~composer_dynsample.config.device.device_defaults`' (2 persistent
    workers, 4 batches ahead each, pinned memory, padding to a multiple of 8); on the CPU it keeps these
    defaults.

    Attributes:
        num_workers (int): Worker processes; they only see indices. Default: ``0``.
        pin_memory (bool, optional): Pin batches for the copy to a GPU; null pins when CUDA is available.
            Default: null.
        persistent_workers (bool): Keep workers between epochs. Default: ``False``.
        prefetch_factor (int, optional): Batches each worker loads ahead, at least 1 (with workers only).
            Default: PyTorch's.
        timeout (float): Seconds to wait for a worker's batch. Default: ``0`` (forever).
        multiprocessing_context (str, optional): ``"fork"``, ``"spawn"`` or ``"forkserver"``. Default: the
            platform's.
        pad_to_multiple_of (int, optional): Text batches only: the collate pads the batch's length up to
            a multiple of this (pad ids, attention mask 0: the values do not change, the shape fills a
            GPU's tensor-core tiles); null or 1 pads to the longest row. Default: null (``8`` on a CUDA
            device, filled by the run).
    """

    num_workers: int = 0
    pin_memory: Optional[bool] = None  # noqa: UP045
    persistent_workers: bool = False
    prefetch_factor: Optional[int] = None  # noqa: UP045
    timeout: float = 0.0
    multiprocessing_context: Optional[str] = None  # noqa: UP045
    pad_to_multiple_of: Optional[int] = None  # noqa: UP045

    def __post_init__(self) -> None:
        _checked(
            "dataloader.num_workers", lambda: check_int("dataloader.num_workers", self.num_workers, minimum=0)
        )
        _checked(
            "dataloader.pad_to_multiple_of",
            lambda: check_int(
                "dataloader.pad_to_multiple_of", self.pad_to_multiple_of, minimum=1, allow_none=True
            ),
        )
        # PyTorch asserts these only once a worker starts (a bare AssertionError mid-run) or not at all.
        if self.prefetch_factor is not None:
            _checked(
                "dataloader.prefetch_factor",
                lambda: check_int("dataloader.prefetch_factor", self.prefetch_factor, minimum=1),
            )
        if self.timeout < 0:
            raise ConfigError(f"dataloader.timeout must be a number of seconds >= 0, got {self.timeout!r}.")
        if self.multiprocessing_context is not None:
            _checked(
                "dataloader.multiprocessing_context",
                lambda: check_choice(
                    "dataloader.multiprocessing_context",
                    self.multiprocessing_context,
                    ("fork", "spawn", "forkserver"),
                ),
            )


def _checked(path: str, check: Any) -> Any:
    """Run a validation check, re-raising its ``ValueError`` as a :class:`ConfigError`."""
    try:
        return check()
    except ConfigError:
        raise
    except ValueError as error:
        raise ConfigError(str(error)) from error


Schema = TypeVar("Schema")


def structured(path: str, values: Mapping[str, Any], schema: type[Schema]) -> Schema:
    """Check a section against a structured config (unknown keys, types, ranges) and return the dataclass.

    Args:
        path (str): The section's name, for messages.
        values (Mapping): The section's keys and values.
        schema (type): A dataclass from this module.

    Example:
        >>> structured("evaluation", {"ks": [1, 10]}, EvaluationConfig).ks
        [1, 10]
        >>> structured("evaluation", {"batch_size": "big"}, EvaluationConfig)
        Traceback (most recent call last):
            ...
        composer_dynsample.config.components.ConfigError: evaluation.batch_size must be of type int, got 'big'.
    """
    fields = {item.name: item for item in dataclasses.fields(schema)}  # type: ignore[arg-type]
    check_keys(path, values, list(fields), path)
    base = OmegaConf.structured(schema)
    for key, value in values.items():
        if fields[key].type in (float, "float") and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)  # OmegaConf warns of the implicit conversion (a FutureWarning per key)
        try:
            base[key] = value
        except OmegaConfBaseException as error:
            wanted = getattr(fields[key].type, "__name__", None) or str(fields[key].type).replace(
                "typing.", ""
            )
            raise ConfigError(f"{path}.{key} must be of type {wanted}, got {value!r}.") from error
    return OmegaConf.to_object(base)  # type: ignore[return-value]


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
