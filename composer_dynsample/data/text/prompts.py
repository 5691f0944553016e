"""Prompts: a fixed string put before every text of a column before it is tokenized.

Retrieval models such as E5 (``"query: "`` / ``"passage: "``), BGE (an instruction before queries only) or
nomic-embed (``"search_query: "`` / ``"search_document: "``) were trained with a prompt before each text and
lose much of their quality without it. sentence-transformers keeps a folder's prompts in
``config_sentence_transformers.json`` (``prompts``: name to string, and ``default_prompt_name``), puts
``prompt + text`` through the tokenizer (so the prompt's tokens count towards ``max_seq_length``), and its
trainer takes prompts by column. This module does the same for the text loaders:

* ``prompts`` maps a column (``anchor``, ``positive``, ``negative``, ``text``) to its prompt. A column
  without one has none, except ``negative``, which takes the ``positive`` column's prompt: negatives
  are passages, and a query model trained with unprompted negatives against prompted positives learns to
  tell the prompt apart rather than the texts.
* A text is interned, hashed and tokenized as ``prompt + text``, so the token cache is keyed by the
  prompts (:func:`prompt_layout`) and a text under two prompts is two texts.
* ``prompt_names`` maps a column to one of a model folder's prompt names (:func:`resolve_prompt_names`).
* Each row of a prompted store knows how many of its first tokens are its prompt's
  (:func:`prompt_token_count`, sentence-transformers' ``prompt_length``), for a pooling that leaves them
  out (``include_prompt: false``).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import Any

__all__ = [
    "PROMPT_COLUMNS",
    "check_prompts",
    "column_prompt",
    "prompt_layout",
    "prompt_token_count",
    "resolve_prompt_names",
]

#: The columns a prompt can be given for.
PROMPT_COLUMNS = ("anchor", "positive", "negative", "text")


def _listed(names: Any) -> str:
    names = [repr(name) for name in names]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + f" or {names[-1]}"


def _by_column(
    mapping: Mapping[Any, Any], key: str, columns: tuple[str, ...], here: str = ""
) -> Iterator[tuple[str, Any]]:
    """``mapping``'s ``(column, value)`` items in order, each column checked to be one of ``columns`` before
    its value is read (a one-line ValueError naming them otherwise)."""
    for column, value in mapping.items():
        if column not in columns:
            raise ValueError(f"{key}: no column {column!r} takes a prompt{here}; choose {_listed(columns)}.")
        yield str(column), value


def check_prompts(
    prompts: Mapping[str, Any] | None, key: str = "prompts", columns: tuple[str, ...] = PROMPT_COLUMNS
) -> dict[str, str]:
    """``prompts`` as a plain dict of non-empty prompts, checked.

    Args:
        prompts (Mapping[str, str] | str, optional): Column to prompt, or one prompt for every column (as
            sentence-transformers' trainer takes it). ``None`` or empty: no prompts.
        key (str): The name the error gives the mapping (``"data.prompts"`` in a config).
        columns (tuple[str, ...]): The columns the data has. Default: :data:`PROMPT_COLUMNS`.

    Returns:
        dict[str, str]: The prompts, empty strings left out.

    Raises:
        ValueError: If ``prompts`` is not a mapping, names a column not in ``columns``, or a prompt is not
            a string.
    """
    if prompts is None:
        return {}
    if isinstance(prompts, str):
        return {column: prompts for column in columns} if prompts else {}
    if not isinstance(prompts, Mapping):
        raise ValueError(
            f"{key} must map columns to prompts, e.g. {{anchor: 'query: ', positive: 'passage: '}}, got "
            f"{type(prompts).__name__} {prompts!r}."
        )
    checked = {}
    for column, prompt in _by_column(prompts, key, columns, " here"):
        if not isinstance(prompt, str):
            raise ValueError(
                f"{key}.{column} must be a string (the text put before each {column}), got "
                f"{type(prompt).__name__} {prompt!r}."
            )
        if prompt:
            checked[column] = prompt
    return checked


def column_prompt(prompts: Mapping[str, str], column: str) -> str:
    """The prompt of ``column``: its own, else (``negative``) the ``positive`` column's, else ``""``."""
    if column in prompts:
        return prompts[column]
    return prompts.get("positive", "") if column == "negative" else ""


def prompt_token_count(prompt: str, tokenizer: Any) -> int:
    """The tokens of ``prompt`` at the start of ``prompt + text``, as sentence-transformers counts them
    (``prompt_length``): the prompt tokenized alone, its closing special token (``[SEP]``, ``</s>``) left
    out, its opening one (``[CLS]``) counted; 0 for no prompt.

    Args:
        prompt (str): The prompt.
        tokenizer (TextTokenizer): The tokenizer of the texts.
    """
    if not prompt:
        return 0
    ids = tokenizer.tokenizer.encode(prompt).ids
    return len(ids) - 1 if ids and ids[-1] in tokenizer.special_ids else len(ids)


def prompt_layout(prompts: Mapping[str, str]) -> str:
    """What the prompts add to a token cache's layout key: ``""`` without prompts."""
    return f";prompts={json.dumps(dict(sorted(prompts.items())), ensure_ascii=False)}" if prompts else ""


def resolve_prompt_names(
    names: Mapping[str, Any] | str | None,
    folder_prompts: Mapping[str, str],
    *,
    key: str = "prompt_names",
    folder: str = "the model folder",
) -> dict[str, str] | str:
    """The prompts that ``names`` (column to prompt name) name among a model folder's prompts.

    Args:
        names (Mapping[str, str] | str, optional): Column to the name of one of ``folder_prompts``, or one
            name for every column. ``None``: no prompts.
        folder_prompts (Mapping[str, str]): The folder's prompts by name (``config_sentence_transformers.json``).
        key (str): The name the error gives ``names``.
        folder (str): The folder, for the error.

    Returns:
        dict[str, str] | str: Column to prompt (empty prompts left out), or the one prompt ``names`` names.

    Raises:
        ValueError: If ``names`` is not one name or a non-empty mapping of known columns to names, a name
            is empty or not a string, or it is not one of the folder's prompts (the error lists them).

    Example:
        >>> resolve_prompt_names({"anchor": "query"}, {"query": "query: "})
        {'anchor': 'query: '}
        >>> resolve_prompt_names({}, {"query": "query: "})
        Traceback (most recent call last):
            ...
        ValueError: prompt_names is an empty mapping, which names no prompt; name one of the model folder's prompts ('query') for each column to prompt, e.g. {anchor: query}, or leave prompt_names out.
    """
    if names is None:
        return {}
    have = f"{_listed(sorted(folder_prompts))}" if folder_prompts else "none: it declares no prompts"
    example = f"{{anchor: {next(iter(sorted(folder_prompts)), 'query')}}}"
    if isinstance(names, str):
        return _named_prompt(names, folder_prompts, key, folder, have)
    if not isinstance(names, Mapping):
        raise ValueError(
            f"{key} must name the model folder's prompts by column, e.g. {example}, or be one name for every "
            f"column; got {type(names).__name__} {names!r}."
        )
    if not names:
        raise ValueError(
            f"{key} is an empty mapping, which names no prompt; name one of {folder}'s prompts ({have}) for "
            f"each column to prompt, e.g. {example}, or leave {key} out."
        )
    resolved = {}
    for column, name in _by_column(names, key, PROMPT_COLUMNS):
        resolved[column] = _named_prompt(name, folder_prompts, f"{key}.{column}", folder, have)
    return {column: prompt for column, prompt in resolved.items() if prompt}


def _named_prompt(name: Any, folder_prompts: Mapping[str, str], where: str, folder: str, have: str) -> str:
    """The folder's prompt called ``name``; a one-line ValueError for a name that is not one of them."""
    if not isinstance(name, str) or not name:
        got = "an empty name" if name == "" else f"{type(name).__name__} {name!r}"
        raise ValueError(
            f"{where} must be the name of one of {folder}'s prompts ({have}), got {got}; leave the column "
            "out for no prompt."
        )
    if name not in folder_prompts:
        listed = f"it has {have}" if folder_prompts else "it declares none"
        raise ValueError(
            f"{where}: {folder} has no prompt named {name!r}; {listed} (config_sentence_transformers.json)."
        )
    return folder_prompts[name]
