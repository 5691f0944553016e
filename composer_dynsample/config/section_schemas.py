"""The structured configs of the sections with fixed keys, and the check that applies one to a section.

The run options (``seed``, ``run_dir``, ``resume_on_changed_data``), ``evaluation`` and ``dataloader``
take a fixed set of keys: each is an OmegaConf structured config, a dataclass whose fields are the valid
keys, with their types and defaults, and whose ``__post_init__`` checks the ranges.
:func:`structured` checks a section's keys and types against one and returns the dataclass; the
readers of these sections in a config (:func:`~composer_dynsample.config.loading.run_options`,
:func:`~composer_dynsample.config.loading.evaluation_config`,
:func:`~composer_dynsample.config.loading.dataloader_config`) are in
:mod:`~composer_dynsample.config.loading`, which also re-exports every name here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Optional, TypeVar

from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from composer_dynsample.config.components import ConfigError, check_keys
from composer_dynsample.validation import check_choice, check_int, check_time

__all__ = ["DataloaderConfig", "EvaluationConfig", "RunOptions", "structured"]

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
