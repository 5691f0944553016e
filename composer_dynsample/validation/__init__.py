"""Argument checks shared by the whole package: one place for every "must be an integer >= 1".

Each check returns the value in its canonical Python type (``int``, ``float``, ``bool``, ``str``) or
raises an error that names the argument, the value seen and what would be valid. Numpy scalars are
accepted where a Python number is (``np.int64(2)`` is an integer), ``bool`` never counts as a number.
Nothing here imports Composer: the miners and samplers stay Composer-free; :func:`parse_time` imports
``composer.core.Time`` only when called. :mod:`~composer_dynsample.validation.values` checks one value,
:mod:`~composer_dynsample.validation.tensors` embeddings, labels and pools,
:mod:`~composer_dynsample.validation.time_strings` Composer time strings.

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

from composer_dynsample.validation.tensors import (
    LABEL_MESSAGES,
    as_labels,
    check_embeddings,
    check_labels,
    check_pool,
)
from composer_dynsample.validation.time_strings import check_time, parse_time
from composer_dynsample.validation.values import (
    InputTypeError,
    check_bool,
    check_choice,
    check_float,
    check_generator,
    check_instance,
    check_int,
    check_keywords,
    describe,
    did_you_mean,
    is_int,
)

__all__ = [
    "LABEL_MESSAGES",
    "InputTypeError",
    "as_labels",
    "check_bool",
    "check_choice",
    "check_embeddings",
    "check_float",
    "check_generator",
    "check_instance",
    "check_int",
    "check_keywords",
    "check_labels",
    "check_pool",
    "check_time",
    "describe",
    "did_you_mean",
    "is_int",
    "parse_time",
]
