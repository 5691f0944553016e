"""The data's prompts in a config: given as strings, named by the model folder, or the folder's default.

A text loader takes ``prompts`` (:mod:`~composer_dynsample.data.text.prompts`): ``data.prompts`` gives
them as strings, by column or one for every column. ``data.prompt_names`` names prompts of the model
folder (``model.encoder.path``: its ``config_sentence_transformers.json``), by column or one name for every
column. With neither, a folder's ``default_prompt_name`` prompts every text, as sentence-transformers'
``encode`` does; a folder that declares prompts but no default is fine-tuned without them, and one warning
line names them and the key that would use them (``data.prompts: {}`` says no prompts on purpose and
silences it). Two towers of two folders take each folder's prompts on its side: the anchors the query
folder's, the positives and negatives the passage folder's (by name, and by default). Data tokenized
already (``data: {name: streaming}``) take none of these keys: :func:`folder_prompts` is what their texts
must carry, checked against the prompts they were converted with.
"""

from __future__ import annotations

import json
import warnings
from typing import Any

from omegaconf import DictConfig

from composer_dynsample.config.components import ConfigError
from composer_dynsample.config.model_folders import model_folder, passage_folder

__all__ = ["data_prompts", "exported_prompts", "folder_prompts"]

# The name an exported folder gives the prompt of a column (sentence-transformers' usual names).
_EXPORT_NAMES = {"anchor": "query", "positive": "document", "negative": "document", "text": "text"}


def data_prompts(
    cfg: DictConfig, given: Any, names: Any, key: str = "data.prompt_names", *, warn: bool = True
) -> Any:
    """The ``prompts`` a text loader gets from ``data.prompts`` (``given``) and ``data.prompt_names``.

    Args:
        cfg (DictConfig): The config (its model folder's prompts).
        given (Mapping[str, str] | str | None): ``data.prompts``.
        names (Mapping[str, str] | str | None): ``data.prompt_names``.
        key (str): What the errors call ``names`` (``"--prompt-name"`` for ``embed``).
        warn (bool): Warn of a folder's prompts left unused (see :func:`_default_prompt`). Default: ``True``.

    Returns:
        The loader's ``prompts``: ``given``, the prompts ``names`` names, the folder's default prompt, or
        ``None``.

    Raises:
        ConfigError: If both keys are set, ``data.prompt_names`` is set without a model folder, is not one
            name or a non-empty mapping of columns to names, or names a prompt the folder lacks.
    """
    if given is not None and names is not None:
        raise ConfigError(
            "data.prompts and data.prompt_names are both set; give the prompts as strings (data.prompts) or "
            "by the model folder's names (data.prompt_names), not both."
        )
    folder, passage = model_folder(cfg), passage_folder(cfg)
    if names is not None:
        if folder is None:
            raise ConfigError(
                f"{key} names prompts of the model folder (model.encoder.path), but the model has none; give "
                "the prompts themselves (data.prompts, or embed's --prompt)."
            )
        plain = _plain(names)
        if passage is None or not isinstance(plain, dict) or not plain:  # one folder, or refused as it is
            return _resolved(plain, folder, key)
        # Two towers of two folders: each column's name is one of its tower's folder's prompts.
        return {
            column: _resolved({column: name}, passage if column != "anchor" else folder, key).get(column, "")
            for column, name in plain.items()
        }
    if given is not None or folder is None:
        return given
    if passage is not None and passage.prompts:  # each tower's folder prompts its own side
        sides = {"anchor": _default_prompt(folder, warn), "positive": _default_prompt(passage, warn)}
        return {column: prompt for column, prompt in sides.items() if prompt} or None
    return _default_prompt(folder, warn) if folder.prompts else given


def folder_prompts(cfg: DictConfig) -> Any:
    """The prompts a run's model folder gives its texts when ``data`` names none (``data_prompts(cfg, None,
    None)``): its default prompt, each tower's of two folders, or ``{}`` for none; ``None`` without a model
    folder. No warning of a folder's prompts without a default: the texts were tokenized already."""
    if model_folder(cfg) is None:
        return None
    return data_prompts(cfg, None, None, warn=False) or {}


def _resolved(names: Any, folder: Any, key: str) -> Any:
    from composer_dynsample.data.text.prompts import resolve_prompt_names

    try:
        return resolve_prompt_names(
            names, folder.prompts, key=key, folder=f"model folder {str(folder.path)!r}"
        )
    except ValueError as error:
        raise ConfigError(str(error)) from None


def _default_prompt(folder: Any, warn: bool = True) -> str | None:
    """A folder's ``default_prompt_name``'s prompt; for a folder that declares prompts but no default, one
    warning line naming them (when ``warn``), and ``None``."""
    if not folder.prompts:
        return None
    if folder.default_prompt_name is not None:
        return folder.prompts[folder.default_prompt_name]
    if not warn:
        return None
    warnings.warn(
        f"model folder {str(folder.path)!r} declares prompts {json.dumps(folder.prompts, ensure_ascii=False)} "
        "but data.prompts and data.prompt_names are unset, so texts are tokenized without them; name them "
        "by column, e.g. data.prompt_names={anchor: "
        + _first_two(folder.prompts)
        + "}, or set data.prompts={} "
        "to train without prompts on purpose.",
        UserWarning,
        stacklevel=3,
    )
    return None


def exported_prompts(cfg: DictConfig, used: dict[str, str]) -> dict[str, Any]:
    """The prompts ``export`` writes to ``config_sentence_transformers.json``: the model folder's (and its
    ``default_prompt_name``), and each prompt the data used (``used``, by column) that the folder lacks,
    named ``query`` (anchors), ``document`` (positives, negatives) or ``text``, else by its column.

    Returns:
        dict[str, Any]: ``{"prompts": {name: prompt}, "default_prompt_name": name or None}``.
    """
    folder = model_folder(cfg)
    prompts = dict(folder.prompts) if folder is not None else {}
    for column, prompt in used.items():
        if prompt in prompts.values():
            continue
        name = _EXPORT_NAMES.get(column, column)
        prompts[name if prompts.get(name, prompt) == prompt else column] = prompt
    return {"prompts": prompts, "default_prompt_name": folder.default_prompt_name if folder else None}


def _plain(value: Any) -> Any:
    """An OmegaConf mapping or list as a dict or list (strings as they are)."""
    from omegaconf import OmegaConf

    return OmegaConf.to_container(value) if OmegaConf.is_config(value) else value


def _first_two(prompts: dict[str, str]) -> str:
    """``query, positive: passage``: the first two prompt names as the anchor's and the positive's."""
    names = list(prompts)
    return names[0] + (f", positive: {names[1]}" if len(names) > 1 else "")
