"""Every rank of a run must resolve the same config: checked before any rank builds or writes anything."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from omegaconf import DictConfig, OmegaConf

from composer_dynsample.config.components import ConfigError

__all__ = ["check_same_config_on_every_rank", "flatten_config"]


def flatten_config(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """The leaves of a nested mapping by dotted key (lists are leaves).

    Example:
        >>> flatten_config({"data": {"name": "digits", "seed": 1}, "seed": 0})
        {'data.name': 'digits', 'data.seed': 1, 'seed': 0}
    """
    leaves: dict[str, Any] = {}
    for key, value in config.items():
        path = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            leaves.update(flatten_config(value, f"{path}."))
        else:
            leaves[path] = value
    return leaves


def check_same_config_on_every_rank(cfg: DictConfig) -> None:
    """Refuse, with the same :class:`ConfigError` on every rank, ranks that resolved different configs.

    A config file or an override that differs on one rank (``data.seed=1`` given to one process, a
    YAML edited on one node) would otherwise train each rank on other data or with another model, and
    the run would end without an error. The ranks compare a hash of the resolved config (interpolations
    such as ``${oc.env:RANK}`` included); when they differ, the error names the keys and each rank's
    value. Call it on the config as loaded and overridden, before the command's own per-rank defaults
    (the progress bar follows each rank's terminal), so no key has to be left out.

    On more than one rank this starts the default process group as Composer's ``Trainer`` would
    (``trainer.device``, ``trainer.dist_timeout``), and the ``Trainer`` then uses it. With one rank it
    does nothing.

    Args:
        cfg (DictConfig): The loaded config (:func:`~composer_dynsample.config.load_config`).

    Raises:
        ConfigError: If any rank's resolved config differs from rank 0's.
    """
    from composer_dynsample.distributed import check_ranks_agree, get_world_size

    if get_world_size() < 2:
        return
    from composer.utils import dist, get_device

    trainer = cfg.get("trainer") or {}
    try:
        device, timeout = get_device(trainer.get("device")), float(trainer.get("dist_timeout", 300.0))
    except (TypeError, ValueError):  # the Trainer rejects these settings later, in one line
        return
    dist.initialize_dist(device, timeout)
    resolved = OmegaConf.to_container(cfg, resolve=True)
    check_ranks_agree(
        {"config": json.dumps(resolved, sort_keys=True, default=repr)},
        subject="config",
        on="the resolved ",
        advice="Give every rank the same config file and the same overrides.",
        details=lambda: flatten_config(resolved),  # type: ignore[arg-type]
        error=ConfigError,
    )
