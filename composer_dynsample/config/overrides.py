"""What a mapping override on the command line leaves out of the section it replaces.

``data={name: pairs, path: my_pairs.jsonl}`` replaces the whole ``data`` section (see
:func:`~composer_dynsample.config.loading.load_config`): a key the file set and the mapping does not
name, such as ``max_length``, is gone. :func:`dropped_keys_note` says which, in one line. The settings
every text loader shares (:data:`TEXT_LOADER_KEYS`: ``max_length``, ``prompts``, ``prompt_names``,
``tokenizer``) carry over from one text loader to another (:func:`carried_keys`): the fine-tuning recipe's
``max_length: 128`` stays when a user's ``data={name: pairs, ...}`` replaces its ``code_search`` section,
and the note says so, instead of the model folder's longer default taking its place unseen.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import yaml
from omegaconf import DictConfig, OmegaConf

from composer_dynsample.config.components import COMPONENT_KEY

__all__ = ["TEXT_LOADERS", "TEXT_LOADER_KEYS", "carried_keys", "dropped_keys_note"]

#: The data loaders of texts, and the settings they all take.
TEXT_LOADERS = ("pairs", "texts", "code_search")
TEXT_LOADER_KEYS = ("max_length", "prompts", "prompt_names", "tokenizer")


def carried_keys(cfg: DictConfig, key: str, mapping: DictConfig | Mapping[str, Any]) -> dict[str, Any]:
    """The settings of text loaders (:data:`TEXT_LOADER_KEYS`) that a ``data`` mapping naming another text
    loader leaves out, with the values the replaced section gave them: they carry over.

    Example:
        >>> cfg = OmegaConf.create({"data": {"name": "code_search", "max_length": 128, "seed": 1}})
        >>> carried_keys(cfg, "data", {"name": "pairs", "path": "my.jsonl"})
        {'max_length': 128}
        >>> carried_keys(cfg, "data", {"name": "mnist1d"})
        {}
    """
    previous = OmegaConf.select(cfg, key, default=None, throw_on_missing=False)
    if key != "data" or not isinstance(previous, DictConfig):
        return {}
    old = OmegaConf.to_container(previous, resolve=False)
    new = OmegaConf.to_container(mapping, resolve=False) if OmegaConf.is_config(mapping) else dict(mapping)
    if (
        old.get("name") not in TEXT_LOADERS
        or new.get("name") not in TEXT_LOADERS
        or old.get("name") == new.get("name")
    ):
        return {}
    return {name: old[name] for name in TEXT_LOADER_KEYS if name in old and name not in new}


def dropped_keys_note(cfg: DictConfig, key: str, mapping: DictConfig | Mapping[str, Any]) -> str | None:
    """The line that says which keys of section ``key`` a replacing ``mapping`` leaves out, or ``None``.

    ``None`` when the section is not a mapping yet, the mapping keeps every key, or it names another
    component than the section (its ``name`` or ``_component_`` differs): the section's keys then belong
    to the component the mapping replaces. ``None`` too when the section names its component (``name``)
    and the mapping names none: the section's check refuses it, and its one line is the whole message.

    Example:
        >>> cfg = OmegaConf.create({"data": {"name": "pairs", "path": "a.jsonl", "max_length": 128}})
        >>> print(dropped_keys_note(cfg, "data", {"name": "pairs", "path": "b.jsonl"}))
        note: data={...} replaced the data section; the config's max_length: 128 is not in it (add it to the mapping, or set data.max_length=128 after it)
        >>> dropped_keys_note(cfg, "data", {"name": "texts", "path": "b.jsonl"}) is None
        True
        >>> dropped_keys_note(cfg, "data", {"path": "b.jsonl"}) is None  # refused: it names no loader
        True
    """
    previous = OmegaConf.select(cfg, key, default=None, throw_on_missing=False)
    if not isinstance(previous, DictConfig):
        return None
    old = OmegaConf.to_container(previous, resolve=False)
    new = OmegaConf.to_container(mapping, resolve=False) if OmegaConf.is_config(mapping) else dict(mapping)
    named = ("name", COMPONENT_KEY)
    if any(name in new for name in named) and any(new.get(name) != old.get(name) for name in named):
        return None
    if "name" in old and not any(name in new for name in named):
        return None  # a section of a named component refuses a mapping of none, in one line of its own
    dropped = {name: value for name, value in old.items() if name not in new}
    if not dropped:
        return None
    shown = [f"{name}: {as_flow(value)}" for name, value in dropped.items()]
    listed = shown[0] if len(shown) == 1 else f"{', '.join(shown[:-1])} and {shown[-1]}"
    verb, pronoun = ("is", "it") if len(shown) == 1 else ("are", "them")
    settings = " ".join(f"{key}.{name}={as_flow(value)}" for name, value in dropped.items())
    return (
        f"note: {key}={{...}} replaced the {key} section; the config's {listed} {verb} not in it "
        f"(add {pronoun} to the mapping, or set {settings} after it)"
    )


def as_flow(value: Any) -> str:
    """A config value as it is written on the command line: YAML in flow style (``[1, 2]``, ``{a: 1}``)."""
    text = yaml.safe_dump(value, default_flow_style=True, width=2**31 - 1).strip()
    return text.removesuffix("...").strip()
