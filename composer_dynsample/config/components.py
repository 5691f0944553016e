"""How a config section reaches a class: short registry names, ``_component_`` dotted paths, checked keys.

A section that builds one object names its target either with ``name:`` (a short alias from a table
such as :data:`~composer_dynsample.config.names.ENCODERS`) or with ``_component_:`` (torchtune's
convention), a dotted import path such as ``my_models.MyEncoder`` or
``pytorch_metric_learning.losses.ArcFaceLoss``. A ``_component_`` without a dot is read as a registry
alias. The section's other keys are the target's keyword arguments, checked against its signature:
an unknown key fails with the valid keys and the closest match, a value of the wrong type (a string
for a ``float`` argument) fails naming the key, both before the target is called
(:func:`resolve_entry`; :func:`resolve_set` for the sections whose entries are a set).
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from composer_dynsample._lazy import load
from composer_dynsample.config.parameters import parameters, type_hints, wrong_kind
from composer_dynsample.validation import did_you_mean

__all__ = [
    "COMPONENT_KEY",
    "ConfigError",
    "Lazy",
    "Registered",
    "call",
    "check_keys",
    "check_types",
    "import_component",
    "peek_entry",
    "peek_parameters",
    "resolve",
    "resolve_entry",
    "resolve_set",
]

#: The key that names a target by its dotted import path.
COMPONENT_KEY = "_component_"


class ConfigError(ValueError):
    """A config key or value is wrong; the message names the key, the value and what is valid."""


_VARIADIC = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)


@dataclass(frozen=True)
class Registered:
    """A target a section can build, and which of its arguments are not config keys.

    Attributes:
        target (Callable[..., Any]): The class or function.
        reserved (tuple[str, ...]): Arguments the builder always supplies; a config key for them is an error.
        inferred (tuple[str, ...]): Arguments the builder supplies unless the config gives them.
        extra (Mapping[str, Any]): Builder-level keys that are not arguments of ``target``, with defaults.
    """

    target: Callable[..., Any]
    reserved: tuple[str, ...] = ()
    inferred: tuple[str, ...] = ()
    extra: Mapping[str, Any] = field(default_factory=dict)

    @property
    def name(self) -> str:
        """The target's name as a user wrote it in Python."""
        return getattr(self.target, "__qualname__", None) or getattr(
            self.target, "__name__", repr(self.target)
        )

    def accepts_any_key(self) -> bool:
        """Whether the target takes ``**kwargs`` (then unknown keys are its business)."""
        return any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters(self.target).values())

    def valid_keys(self) -> list[str]:
        """The keys a config section may hold for this entry (besides ``name``/``_component_``)."""
        keys = [
            name
            for name, parameter in parameters(self.target).items()
            if parameter.kind not in _VARIADIC and name not in self.reserved
        ]
        return sorted({*keys, *self.extra})

    def required_keys(self) -> list[str]:
        """Arguments without a default that neither the builder nor ``extra`` supplies."""
        return [
            name
            for name, parameter in parameters(self.target).items()
            if parameter.default is inspect.Parameter.empty
            and parameter.kind not in _VARIADIC
            and name not in self.reserved
            and name not in self.inferred
        ]


class Lazy:
    """A registry target imported on first use: reading a config stays fast (no torch or Composer until a
    section's target is needed) and optional dependencies (wandb, mlflow) stay optional.

    Args:
        module (str): The module to import.
        attribute (str): The class or function in it.
        reserved, inferred, extra: As for :class:`Registered`.
    """

    def __init__(
        self,
        module: str,
        attribute: str,
        *,
        reserved: tuple[str, ...] = (),
        inferred: tuple[str, ...] = (),
        extra: Mapping[str, Any] | None = None,
    ) -> None:
        self.module, self.attribute = module, attribute
        self.reserved, self.inferred, self.extra = reserved, inferred, dict(extra or {})

    def get(self) -> Callable[..., Any]:
        """Import and return the target (:func:`composer_dynsample._lazy.load`)."""
        return load(self.module, self.attribute)


def check_keys(path: str, section: Mapping[str, Any], valid: Sequence[str], what: str) -> None:
    """Raise a :class:`ConfigError` for the first key of ``section`` not in ``valid``, with the closest match.

    Example:
        >>> check_keys("optimizer", {"lr": 0.1, "weight_decy": 0.1}, ["lr", "weight_decay"], "AdamW")
        Traceback (most recent call last):
            ...
        composer_dynsample.config.components.ConfigError: optimizer: unknown key 'weight_decy' for AdamW; valid keys: ['lr', 'weight_decay']. Did you mean 'weight_decay'?
    """
    unknown = [key for key in section if key not in valid]
    if unknown:
        key = str(unknown[0])
        raise ConfigError(
            f"{path}: unknown key {key!r} for {what}; valid keys: {sorted(valid)}.{did_you_mean(key, valid)}"
        )


def import_component(path: str, dotted: Any) -> Callable[..., Any]:
    """Import ``package.module.Name`` (the value of a ``_component_`` key), or raise a one-line ConfigError.

    Example:
        >>> import_component("optimizer._component_", "torch.optim.SGD").__name__
        'SGD'
    """
    if not isinstance(dotted, str) or "." not in dotted.strip(".") or " " in dotted:
        raise ConfigError(
            f"{path} must be a dotted import path such as 'my_models.MyEncoder', got {dotted!r}."
        )
    module_name, _, attribute = dotted.rpartition(".")
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise ConfigError(
            f"{path}: cannot import {module_name!r} for {dotted!r}: {error}. Is its folder on PYTHONPATH "
            "(e.g. PYTHONPATH=. composer-dynsample train ...)?"
        ) from error
    target = getattr(module, attribute, None)
    if target is None or not callable(target):
        raise ConfigError(f"{path}: module {module_name!r} has no class or function {attribute!r}.")
    return target


def resolve(
    path: str,
    section: dict[str, Any],
    registry: Mapping[str, Registered | Lazy],
    *,
    default: str | None = None,
    name_key: bool = True,
) -> tuple[Registered, str]:
    """Pop ``name``/``_component_`` from a section and find its target.

    Args:
        path (str): The section's dotted path, for messages (``"model.encoder"``).
        section (dict): The section's keys; ``name`` and ``_component_`` are removed from it.
        registry (Mapping): Short names and their entries.
        default (str, optional): The registry name used when the section names nothing. Default: none
            (then naming nothing is an error).
        name_key (bool): Whether ``name`` names the target; ``False`` where the registry name is the
            section's own label (``callbacks: {lr_monitor: {}}``) and ``name`` is an ordinary key. Default:
            ``True``.

    Returns:
        tuple[Registered, str]: The entry (a dotted path gets one with no reserved arguments) and the
        registry name, or the dotted path.
    """
    if name_key and "name" in section and COMPONENT_KEY in section:
        component = section[COMPONENT_KEY]
        raise ConfigError(
            f"{path}: give either 'name' ({section['name']!r}) or '{COMPONENT_KEY}' ({component!r}), not both; "
            f"to replace the section, override it whole: {path}={{{COMPONENT_KEY}: {component}, ...}}."
        )
    if COMPONENT_KEY in section:
        value = section.pop(COMPONENT_KEY)
        if isinstance(value, str) and value in registry:
            return lookup(f"{path}.{COMPONENT_KEY}", value, registry), value
        return Registered(import_component(f"{path}.{COMPONENT_KEY}", value)), str(value)
    if default is not None and not name_key:
        return lookup(path, default, registry), default
    if "name" not in section and default is None:
        raise ConfigError(
            f"{path} needs a 'name' (valid names: {sorted(registry)}) or a '{COMPONENT_KEY}' "
            "such as 'my_package.MyClass'."
        )
    name = section.pop("name", default)
    return lookup(f"{path}.name", name, registry), name


def lookup(path: str, name: Any, registry: Mapping[str, Registered | Lazy]) -> Registered:
    """The registry entry of ``name``, or a ConfigError with the valid names and the closest one."""
    if not isinstance(name, str) or name not in registry:
        hint = did_you_mean(name, list(registry))
        raise ConfigError(
            f"{path}: unknown name {name!r}; valid names: {sorted(registry)}, or a '{COMPONENT_KEY}' "
            f"dotted path such as 'my_package.MyClass'.{hint}"
        )
    entry = registry[name]
    if isinstance(entry, Lazy):
        try:
            return Registered(entry.get(), entry.reserved, entry.inferred, entry.extra)
        except (ImportError, AttributeError) as error:
            raise ConfigError(f"{path}: {name!r} is not available here: {error}") from error
    return entry


def resolve_entry(
    path: str,
    values: dict[str, Any],
    registry: Mapping[str, Any],
    *,
    reserved: tuple[str, ...] = (),
    supplied: Mapping[str, Any] | None = None,
    **kwargs: Any,
) -> tuple[Registered, str, dict[str, Any], dict[str, Any]]:
    """Resolve a section's target and check its keys: ``(entry, name, kwargs, builder-level extras)``.

    ``supplied`` holds values the builder fills in for the arguments of those names that the target takes
    and the section leaves out (an encoder's input sizes).
    """
    entry, name = resolve(path, values, registry, **kwargs)
    if reserved and not entry.reserved:  # a _component_: the builder's own arguments are not keys
        entry = Registered(entry.target, reserved=reserved, inferred=("seed",))
    takes = parameters(entry.target)
    for key, value in (supplied or {}).items():
        if key in takes:
            values.setdefault(key, value)
    if not entry.accepts_any_key():
        check_keys(path, values, entry.valid_keys(), repr(name))
    missing = [arg for arg in entry.required_keys() if arg not in values]
    if missing:
        raise ConfigError(f"{path}: {name!r} needs the key {missing[0]!r}; valid keys: {entry.valid_keys()}.")
    extras = {key: values[key] for key in entry.extra if key in values}
    return entry, name, {key: value for key, value in values.items() if key not in entry.extra}, extras


def peek_entry(path: str, values: dict[str, Any], registry: Mapping[str, Any]) -> Any:
    """The target a section names, without consuming its keys (for choices that depend on the target)."""
    return resolve(path, dict(values), registry)[0].target


def peek_parameters(
    path: str, values: Mapping[str, Any], registry: Mapping[str, Any]
) -> Mapping[str, inspect.Parameter]:
    """The :func:`parameters` of the target a section names (:func:`peek_entry`), its keys not consumed."""
    return parameters(peek_entry(path, dict(values), registry))


def resolve_set(
    path: str,
    values: Mapping[str, Any],
    registry: Mapping[str, Any],
    supplied: Mapping[str, Any] | None = None,
) -> list[tuple[str, Registered, dict[str, Any]]]:
    """Resolve and check every entry of a ``{label: keys}`` section; null entries are off.

    Args:
        path (str): The section's name, for messages (``"algorithms"``).
        values (Mapping[str, Any]): The section: each label and its keyword arguments, or null.
        registry (Mapping[str, Any]): Short names and their entries; a label names its target unless its
            keys hold a ``_component_``.
        supplied (Mapping[str, Any], optional): Values for the arguments of those names that a target takes
            and its keys leave out. Default: none.

    Returns:
        list[tuple[str, Registered, dict[str, Any]]]: ``(path.label, entry, kwargs)`` of each entry that is on.

    Raises:
        ConfigError: If an entry is not a mapping or null, or its name or keys are wrong.
    """
    entries = []
    for label, keys in values.items():
        if keys is None:
            continue
        if not isinstance(keys, Mapping):
            raise ConfigError(
                f"{path}.{label} must be a mapping of keyword arguments ({{}} for the defaults) or null, got {keys!r}."
            )
        keys = dict(keys)
        default = None if COMPONENT_KEY in keys else label  # without a _component_ the label names the target
        entry, _, kwargs, _ = resolve_entry(
            f"{path}.{label}", keys, registry, default=default, name_key=False, supplied=supplied
        )
        entries.append((f"{path}.{label}", entry, kwargs))
    return entries


def check_types(path: str, entry: Registered, kwargs: Mapping[str, Any]) -> None:
    """Raise a ConfigError naming the key whose value's type the target's signature rules out.

    Only plain values are judged (numbers, strings, booleans, null, lists) against plain annotations
    or, without one, the default's type; anything else is left to the target.

    Example:
        >>> import torch
        >>> check_types("optimizer", Registered(torch.optim.SGD), {"lr": "fast"})
        Traceback (most recent call last):
            ...
        composer_dynsample.config.components.ConfigError: optimizer.lr must be a number, got 'fast' (a string).
    """
    signature = parameters(entry.target)
    hints = type_hints(entry.target)
    for key, value in kwargs.items():
        parameter = signature.get(key)
        if parameter is None or parameter.kind in _VARIADIC:
            continue
        wrong = wrong_kind(parameter, hints, value)
        if wrong is not None:
            raise ConfigError(f"{path}.{key} {wrong}.")


def call(path: str, entry: Registered, kwargs: Mapping[str, Any], *args: Any) -> Any:
    """Check ``kwargs`` against ``entry`` and construct ``entry.target(*args, **kwargs)``.

    Errors of the target (``TypeError``, ``ValueError``, ``IndexError`` as from ``AdamW(betas=(0.9,))``)
    and a missing optional package (``ImportError``) become one-line :class:`ConfigError` messages that
    name the section.
    """
    check_types(path, entry, kwargs)
    try:
        return entry.target(*args, **kwargs)
    except ImportError as error:
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise ConfigError(
            f"{path}: {entry.name} needs a package that is not installed: {first_line}"
        ) from error
    except (TypeError, ValueError, IndexError) as error:
        shown = ", ".join(f"{key}={value!r}" for key, value in kwargs.items() if key not in entry.reserved)
        raise ConfigError(f"{path}: {entry.name}({shown}) rejected the config: {error}") from error
