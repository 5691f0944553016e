"""Argument checks shared by the whole package: one place for every "must be an integer >= 1".

Each check returns the value in its canonical Python type (``int``, ``float``, ``bool``, ``str``) or
raises an error that names the argument, the value seen and what would be valid. Numpy scalars are
accepted where a Python number is (``np.int64(2)`` is an integer), ``bool`` never counts as a number.
Nothing here imports Composer: the miners and samplers stay Composer-free; :func:`parse_time` imports
``composer.core.Time`` only when called.

Example:
    >>> check_int("num_replicas", 2, minimum=1)
    2
    >>> check_float("margin", 0.2, minimum=0.0)
    0.2
    >>> check_choice("distance", "cosine", ("cosine", "euclidean"))
    'cosine'
    >>> check_int("k", 0, minimum=1)
    Traceback (most recent call last):
        ...
    ValueError: k must be an integer >= 1, got 0.
"""

from __future__ import annotations

import difflib
import math
import numbers
import re
import sys
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np

from composer_dynsample.deferred_checks import value_checks_deferred

if TYPE_CHECKING:
    import torch
    from composer.core import Time, TimeUnit

__all__ = [
    "LABEL_MESSAGES",
    "InputTypeError",
    "as_labels",
    "check_bool",
    "check_choice",
    "check_embeddings",
    "check_float",
    "check_generator",
    "check_int",
    "check_labels",
    "check_pool",
    "check_time",
    "describe",
    "did_you_mean",
    "is_int",
    "parse_time",
]


class InputTypeError(TypeError, ValueError):
    """An argument has the wrong type: both a ``TypeError`` and a ``ValueError``, so callers that catch
    either (configs catch ``ValueError``, Python convention says ``TypeError``) see it."""


def is_int(value: object) -> bool:
    """Whether ``value`` is an integer (Python or numpy), not a ``bool``."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def _range_text(minimum: float | None, maximum: float | None, *, strict: tuple[bool, bool]) -> str:
    if minimum is not None and maximum is not None:
        left, right = "(" if strict[0] else "[", ")" if strict[1] else "]"
        return f" in {left}{minimum}, {maximum}{right}"
    if minimum is not None:
        return f" {'>' if strict[0] else '>='} {minimum}"
    if maximum is not None:
        return f" {'<' if strict[1] else '<='} {maximum}"
    return ""


def _in_range(value: float, minimum: float | None, maximum: float | None, strict: tuple[bool, bool]) -> bool:
    if minimum is not None and (value < minimum or (strict[0] and value == minimum)):
        return False
    return not (maximum is not None and (value > maximum or (strict[1] and value == maximum)))


def check_int(
    name: str,
    value: object,
    *,
    minimum: int | None = None,
    maximum: int | None = None,
    allow_none: bool = False,
) -> int | None:
    """Return ``int(value)`` if it is an integer within ``[minimum, maximum]``, else raise ``ValueError``.

    Args:
        name (str): The argument's name, as the caller knows it.
        value (object): The value to check.
        minimum (int, optional): The smallest valid value. Default: no bound.
        maximum (int, optional): The largest valid value. Default: no bound.
        allow_none (bool): Return ``None`` for ``None`` instead of raising. Default: ``False``.

    Example:
        >>> check_int("rank", np.int64(1), minimum=0, maximum=1)
        1
        >>> check_int("rank", 2, minimum=0, maximum=1)
        Traceback (most recent call last):
            ...
        ValueError: rank must be an integer in [0, 1], got 2.
    """
    if value is None and allow_none:
        return None
    if not is_int(value) or not _in_range(int(value), minimum, maximum, (False, False)):  # type: ignore[arg-type]
        valid = _range_text(minimum, maximum, strict=(False, False))
        raise ValueError(f"{name} must be an integer{valid}, got {value!r}.")
    return int(value)  # type: ignore[arg-type]


def check_float(
    name: str,
    value: object,
    *,
    minimum: float | None = None,
    maximum: float | None = None,
    strict_minimum: bool = False,
    strict_maximum: bool = False,
    finite: bool = True,
) -> float:
    """Return ``float(value)`` if it is a real number within the bounds, else raise ``ValueError``.

    Args:
        name (str): The argument's name.
        value (object): The value to check (``int``, ``float`` or a numpy real; not ``bool``).
        minimum (float, optional): Lower bound. Default: none.
        maximum (float, optional): Upper bound. Default: none.
        strict_minimum (bool): Exclude ``minimum`` itself. Default: ``False``.
        strict_maximum (bool): Exclude ``maximum`` itself. Default: ``False``.
        finite (bool): Reject NaN and infinities. Default: ``True``.

    Example:
        >>> check_float("pct_start", 0.25, minimum=0, maximum=1, strict_minimum=True, strict_maximum=True)
        0.25
        >>> check_float("dropout", 1.0, minimum=0, maximum=1, strict_maximum=True)
        Traceback (most recent call last):
            ...
        ValueError: dropout must be a number in [0, 1), got 1.0.
    """
    strict = (strict_minimum, strict_maximum)
    valid = _range_text(minimum, maximum, strict=strict)
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name} must be a number{valid}, got {value!r}.")
    number = float(value)
    if finite and not math.isfinite(number):
        raise ValueError(f"{name} must be a finite number{valid}, got {value!r}.")
    if not math.isnan(number) and not _in_range(number, minimum, maximum, strict):
        raise ValueError(f"{name} must be a number{valid}, got {value!r}.")
    return number


def check_bool(name: str, value: object) -> bool:
    """Return ``value`` if it is a ``bool``, else raise ``ValueError`` (``1`` and ``"yes"`` are not).

    Example:
        >>> check_bool("normalize", True)
        True
    """
    if not isinstance(value, (bool, np.bool_)):
        raise ValueError(f"{name} must be true or false, got {value!r}.")
    return bool(value)


def check_generator(name: str, value: object) -> torch.Generator | None:
    """Return ``value`` if it is a ``torch.Generator`` or ``None``, else raise :class:`InputTypeError`.

    Example:
        >>> check_generator("generator", 0)
        Traceback (most recent call last):
            ...
        composer_dynsample.validation.InputTypeError: generator must be a torch.Generator or None, got an object of type int.
    """
    import torch

    if value is not None and not isinstance(value, torch.Generator):
        raise InputTypeError(f"{name} must be a torch.Generator or None, got {describe(value)}.")
    return value


def check_choice(name: str, value: object, choices: Iterable[str]) -> str:
    """Return ``value`` if it is one of ``choices``, else raise ``ValueError`` listing them.

    Example:
        >>> check_choice("gather", "all", ("autograd", "constant"))
        Traceback (most recent call last):
            ...
        ValueError: gather must be one of ('autograd', 'constant'), got 'all'.
    """
    options = tuple(choices)
    if not isinstance(value, str) or value not in options:
        raise ValueError(f"{name} must be one of {options}, got {value!r}.")
    return value


def did_you_mean(value: object, options: Iterable[str]) -> str:
    """``" Did you mean 'x'?"`` for the option closest to a misspelt ``value``, else ``""``.

    Example:
        >>> did_you_mean("semihard", ("batch_hard", "semi_hard"))
        " Did you mean 'semi_hard'?"
        >>> did_you_mean("triplet", ("batch_hard", "semi_hard"))
        ''
    """
    if not isinstance(value, str):
        return ""
    matches = difflib.get_close_matches(value, list(options), n=1, cutoff=0.6)
    return f" Did you mean {matches[0]!r}?" if matches else ""


def describe(value: object) -> str:
    """A short description of a value for error messages: a tensor's shape and dtype, else its type."""
    torch = sys.modules.get("torch")  # no tensor exists unless torch has been imported
    if torch is not None and isinstance(value, torch.Tensor):
        return f"a tensor of shape {tuple(value.shape)} and dtype {value.dtype}"
    return f"an object of type {type(value).__name__}"


def check_embeddings(name: str, value: object, *, finite: bool = True) -> torch.Tensor:
    """Return ``value`` if it is a ``(N, D)`` floating-point tensor with ``D >= 1`` (finite if asked).

    A non-tensor or non-float tensor raises :class:`InputTypeError`; a wrong shape or NaN/inf a
    ``ValueError``.

    Example:
        >>> import torch
        >>> check_embeddings("embeddings", torch.zeros(3, 2)).shape
        torch.Size([3, 2])
        >>> check_embeddings("embeddings", torch.zeros(3))
        Traceback (most recent call last):
            ...
        ValueError: embeddings must be a 2-D floating-point tensor (num_items, dim), got a tensor of shape (3,) and dtype torch.float32.
    """
    import torch

    if not isinstance(value, torch.Tensor) or not value.is_floating_point():
        raise InputTypeError(
            f"{name} must be a 2-D floating-point tensor (num_items, dim), got {describe(value)}."
        )
    if value.ndim != 2 or value.shape[1] == 0:
        raise ValueError(
            f"{name} must be a 2-D floating-point tensor (num_items, dim), got {describe(value)}."
        )
    # min and max propagate NaN and expose +-inf: one fused reduction instead of an isfinite pass. A training
    # step that checks finiteness on the device (deferred_checks) skips this host read.
    if finite and value.numel() > 0 and value_checks_deferred() is None and not _all_finite(value):
        raise ValueError(f"{name} contain NaN or inf.")
    return value


def _all_finite(value: torch.Tensor) -> bool:
    import torch

    return bool(torch.isfinite(torch.stack(torch.aminmax(value))).all())


_LENGTH_MESSAGE = "{name} has {count} entries but {items_name} has {num_items} rows; they must match."

#: The messages of :func:`as_labels`, by the check that failed; a caller may word any of them its own way.
LABEL_MESSAGES = {
    "dtype": "{name} must hold integers, got {got}.",
    "ndim": "{name} must be 1-D, got shape {shape}.",
    "length": _LENGTH_MESSAGE,
}


def _is_integer_dtype(dtype: object) -> bool:
    """Whether a numpy or torch dtype holds integers (``bool`` does not)."""
    if isinstance(dtype, np.dtype):
        return bool(np.issubdtype(dtype, np.integer))
    return not (dtype.is_floating_point or dtype.is_complex or str(dtype) == "torch.bool")  # type: ignore[attr-defined]


def check_labels(
    name: str, value: object, num_items: int | None = None, items_name: str = ""
) -> torch.Tensor:
    """Return ``value`` if it is a 1-D integer tensor (of ``num_items`` entries when given).

    For labels that are tensors already, e.g. in a training step: the tensor is returned as it is, on its
    device, and nothing is copied or synchronised. Labels a user hands over as a list, a numpy array or a
    tensor, to be stored, go through :func:`as_labels`.

    A non-tensor or a tensor of another dtype raises :class:`InputTypeError`; another shape or length a
    ``ValueError``.

    Example:
        >>> import torch
        >>> check_labels("labels", torch.tensor([0, 1]), 3, "embeddings")
        Traceback (most recent call last):
            ...
        ValueError: labels has 2 entries but embeddings has 3 rows; they must match.
    """
    import torch

    if not isinstance(value, torch.Tensor) or not _is_integer_dtype(value.dtype):
        raise InputTypeError(f"{name} must be a 1-D integer tensor, got {describe(value)}.")
    if value.ndim != 1:
        raise ValueError(f"{name} must be a 1-D integer tensor, got {describe(value)}.")
    if num_items is not None and value.shape[0] != num_items:
        count = value.shape[0]
        raise ValueError(
            _LENGTH_MESSAGE.format(name=name, count=count, num_items=num_items, items_name=items_name)
        )
    return value


def as_labels(
    name: str,
    value: object,
    num_items: int | None = None,
    items_name: str = "",
    *,
    to: str = "numpy",
    messages: Mapping[str, str] | None = None,
) -> np.ndarray | torch.Tensor:
    """Convert 1-D integer labels (a list, a numpy array or a tensor on any device) to int64 on the CPU.

    For labels (or indices) a user hands over to be stored, by a sampler, a dataset or a file loader;
    tensors a training step holds are checked by :func:`check_labels`. An empty sequence counts as integers.
    A wrong dtype, shape or length (``num_items`` entries, those of ``items_name``) raises ``ValueError``.

    Args:
        to (str): ``"numpy"`` (an array) or ``"torch"`` (a contiguous tensor). A list or an array is
            converted first, so that a wrong dtype is named as that type names it. Default: ``"numpy"``.
        messages (Mapping[str, str], optional): Replaces some of :data:`LABEL_MESSAGES`, format strings
            over ``name``, ``got`` (``"dtype float64"``, ``"a tensor of dtype torch.float32"``, ``"an
            array of Python objects"``), ``dtype`` (the input's own), ``shape``, ``count``, ``num_items``
            and ``items_name``. Default: none.

    Example:
        >>> as_labels("labels", [3, 1, 3])
        array([3, 1, 3])
        >>> as_labels("labels", [0.0, 1.0], to="torch")
        Traceback (most recent call last):
            ...
        ValueError: labels must hold integers, got dtype torch.float64.
    """
    import torch

    check_choice("to", to, ("numpy", "torch"))
    if isinstance(value, torch.Tensor):
        labels: np.ndarray | torch.Tensor = value.detach().cpu().to_dense()
        dtype, got = value.dtype, f"a tensor of dtype {value.dtype}"
    else:
        labels = np.asarray(value)
        if labels.size == 0:
            labels = labels.astype(np.int64)  # np.asarray([]) is float64
        dtype = labels.dtype
        if to == "torch" and dtype.kind in "biufc":  # numbers: named, and checked, as torch names them
            labels = torch.from_numpy(labels.copy())
        got = "an array of Python objects" if dtype.kind == "O" else f"dtype {labels.dtype}"
    wording = {**LABEL_MESSAGES, **(messages or {})}
    fields = {"name": name, "got": got, "dtype": dtype, "shape": tuple(labels.shape)}
    if not _is_integer_dtype(labels.dtype):
        raise ValueError(wording["dtype"].format(**fields))
    if labels.ndim != 1:
        raise ValueError(wording["ndim"].format(**fields))
    if num_items is not None and labels.shape[0] != num_items:
        count = labels.shape[0]
        raise ValueError(
            wording["length"].format(**fields, count=count, num_items=num_items, items_name=items_name)
        )
    if to == "torch":
        return torch.as_tensor(labels).to(torch.int64).contiguous()
    array = labels.numpy() if isinstance(labels, torch.Tensor) else labels
    return array.astype(np.int64, copy=False)


def check_pool(
    batch: tuple[object, object],
    pool: tuple[object, object],
    names: tuple[str, str, str, str],
    *,
    finite: bool = True,
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Check a batch ``(embeddings, labels)`` and its optional pool of reference rows ``(embeddings, labels)``.

    Both halves of the pool are given or neither; each half is checked like the batch, and the pool
    has the batch's dimension. ``names`` are the four arguments' names, as the caller spells them.

    Returns:
        The checked pool, or ``None`` when neither half is given.

    Example:
        >>> import torch
        >>> names = ("embeddings", "labels", "ref_emb", "ref_labels")
        >>> batch = (torch.zeros(3, 2), torch.tensor([0, 0, 1]))
        >>> check_pool(batch, (None, None), names) is None
        True
        >>> check_pool(batch, (torch.zeros(4, 5), torch.zeros(4, dtype=torch.long)), names)
        Traceback (most recent call last):
            ...
        ValueError: ref_emb has dimension 5 but embeddings 2; they must match.
    """
    emb_name, labels_name, ref_name, ref_labels_name = names
    embeddings = check_embeddings(emb_name, batch[0], finite=finite)
    check_labels(labels_name, batch[1], embeddings.shape[0], emb_name)
    ref_embeddings, ref_labels = pool
    if (ref_embeddings is None) != (ref_labels is None):
        given, missing = (ref_name, ref_labels_name) if ref_labels is None else (ref_labels_name, ref_name)
        raise ValueError(
            f"{ref_name} and {ref_labels_name} must be given together: {given} was given without {missing}."
        )
    if ref_embeddings is None:
        return None
    ref_embeddings = check_embeddings(ref_name, ref_embeddings, finite=finite)
    ref_labels = check_labels(ref_labels_name, ref_labels, ref_embeddings.shape[0], ref_name)
    if ref_embeddings.shape[1] != embeddings.shape[1]:
        raise ValueError(
            f"{ref_name} has dimension {ref_embeddings.shape[1]} but {emb_name} {embeddings.shape[1]}; "
            "they must match."
        )
    return ref_embeddings, ref_labels


_TIME_STRING = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)(?:e([+-]?\d+))?\s*([a-z]+)\s*$")
_EXAMPLES = {"ep": "2ep", "ba": "500ba", "sp": "10000sp", "tok": "1000tok", "dur": "0.5dur"}


def check_time(
    name: str, value: object, units: Sequence[str] = ("ep", "ba", "sp", "tok")
) -> tuple[float, str]:
    """Check a Composer time string without importing Composer: ``(value, unit)``, or a ``ValueError``.

    ``"2ep"``, ``"500ba"``, ``"1e4sp"``, ``"0.5dur"``: a number and one of ``units`` (Composer's unit
    names); a bare non-negative integer counts epochs. Counts other than durations must be whole.

    Example:
        >>> check_time("max_duration", "60ep"), check_time("interval", 3)
        ((60.0, 'ep'), (3.0, 'ep'))
        >>> check_time("interval", "1dur", ("ep", "ba"))
        Traceback (most recent call last):
            ...
        ValueError: interval must be a Composer time string such as '2ep', '500ba', got '1dur'.
    """
    allowed = tuple(units)
    if is_int(value) and int(value) >= 0 and "ep" in allowed:  # type: ignore[arg-type]
        return float(value), "ep"  # type: ignore[arg-type]
    match = _TIME_STRING.match(value) if isinstance(value, str) else None
    if match is not None:
        number = float(match.group(1)) * 10 ** int(match.group(2) or 0)
        if match.group(3) in allowed and (match.group(3) == "dur" or number == int(number)):
            return number, match.group(3)
    shown = "', '".join(_EXAMPLES.get(unit, f"1{unit}") for unit in allowed)
    raise ValueError(f"{name} must be a Composer time string such as '{shown}', got {value!r}.")


def parse_time(name: str, value: object, units: Sequence[TimeUnit | str] | None = None) -> Time:
    """Parse a Composer time string (``"2ep"``, ``"500ba"``, ``"10000sp"``) into a ``Time``; see :func:`check_time`.

    Args:
        name (str): The argument's name.
        value (object): A time string, a ``composer.core.Time`` or a non-negative int (epochs).
        units (Sequence[TimeUnit | str], optional): The units allowed. Default: epochs, batches, samples,
            tokens.

    Example:
        >>> parse_time("memory_start", "2ep")
        Time(2, TimeUnit.EPOCH)
        >>> parse_time("interval", "1dur")
        Traceback (most recent call last):
            ...
        ValueError: interval must be a Composer time string such as '2ep', '500ba', '10000sp', '1000tok', got '1dur'.
    """
    allowed = tuple(getattr(unit, "value", unit) for unit in (units or ("ep", "ba", "sp", "tok")))
    if type(value).__name__ == "Time" and getattr(getattr(value, "unit", None), "value", None) in allowed:
        return value  # type: ignore[return-value]
    number, unit = check_time(name, value, allowed)
    from composer.core import Time, TimeUnit

    return Time(number if unit == "dur" else int(number), TimeUnit(unit))
