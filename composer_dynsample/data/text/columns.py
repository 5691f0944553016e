"""The ``columns`` mapping of the text loaders, and what a table that lacks a column is told.

Columns under other names are mapped with ``columns`` (``data.columns`` in a config): ``{"anchor":
"query", "positive": "pos"}`` reads the file's ``query`` column as ``anchor``
(:func:`~composer_dynsample.data.text.table.read_text_tables` applies it). :func:`check_column_map`
checks such a mapping before a file is read; :func:`require_columns` names a missing column with the
columns found, the close ones ("did you mean"), and the mapping that would read them, or a delimiter
the file looks split by.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping, Sequence

from composer_dynsample.data.text.table import TextTable
from composer_dynsample.validation import did_you_mean

__all__ = ["check_column_map", "require_columns"]

# Column names that other tools use for the roles of the loaders, for the mapping a missing column suggests.
_SYNONYMS = {
    "anchor": ("query", "question", "sentence1", "sentence_a", "text1", "title", "q", "docstring", "source"),
    "positive": ("pos", "answer", "document", "passage", "code", "sentence2", "sentence_b", "text2",
                 "response", "a", "context", "doc", "target"),
    "negative": ("neg", "hard_negative", "negatives"),
    "text": ("sentence", "content", "body", "utterance", "document", "passage", "query", "anchor"),
    "label": ("labels", "class", "intent", "category", "target", "entity", "y", "id"),
}  # fmt: skip


def check_column_map(columns: Mapping[str, str] | None, roles: Sequence[str]) -> dict[str, str]:
    """Check a ``columns`` mapping (a loader's name of a column to the file's name) and return it as a dict.

    Args:
        columns (Mapping[str, str], optional): The mapping, e.g. ``{"anchor": "query"}``; ``None`` maps none.
        roles (Sequence[str]): The names it may map; ``"negative"`` also admits ``negative_1`` ...

    Raises:
        ValueError: If it is not a mapping of strings, maps an unknown name, or maps two to one column.

    Example:
        >>> check_column_map({"anchor": "query", "positive": "pos"}, ("anchor", "positive"))
        {'anchor': 'query', 'positive': 'pos'}
        >>> check_column_map({"anchr": "query"}, ("anchor", "positive"))
        Traceback (most recent call last):
            ...
        ValueError: columns: 'anchr' is not a column this loader reads; map one of ['anchor', 'positive'] to a column of the file. Did you mean 'anchor'?
    """
    if columns is None:
        return {}
    if not isinstance(columns, Mapping):
        raise ValueError(
            f"columns must map the loader's column names to the file's, e.g. {{anchor: query}}, got {columns!r}."
        )
    names = {str(key): value for key, value in columns.items()}
    for role, column in names.items():
        valid = role in roles or ("negative" in roles and re.fullmatch(r"negative_\d+", role) is not None)
        if not valid:
            raise ValueError(
                f"columns: {role!r} is not a column this loader reads; map one of {list(roles)} to a "
                f"column of the file.{did_you_mean(role, roles)}"
            )
        if not isinstance(column, str) or not column:
            raise ValueError(f"columns.{role} must name a column of the file (a string), got {column!r}.")
    repeated = sorted({column for column in names.values() if list(names.values()).count(column) > 1})
    if repeated:
        raise ValueError(f"columns: the file's column {repeated[0]!r} is mapped twice; map each column once.")
    return names


def _suggested_map(table: TextTable, missing: Sequence[str], present: Sequence[str]) -> dict[str, str]:
    """For each missing column, the file's column it most likely is: a close spelling, else a name
    other tools use for it; only when every missing column gets a distinct one."""
    unused = [name for name in table.found if name not in present and name not in table.renamed.values()]
    chosen: dict[str, str] = {}
    for role in missing:
        base = "negative" if role.startswith("negative") else role
        close = difflib.get_close_matches(role, [n for n in unused if n not in chosen.values()], n=1)
        known = [n for n in unused if n.lower() in _SYNONYMS.get(base, ()) and n not in chosen.values()]
        if close or known:
            chosen[role] = (close or known)[0]
    return chosen if len(chosen) == len(missing) else {}


def _delimiter_hint(table: TextTable) -> str:
    """A hint when a text file's header is one column that another delimiter would split."""
    if table.lines is None or len(table.found) != 1:
        return ""
    header = table.found[0]
    used = (
        ";"
        if ";" in header
        else "\t"
        if "\t" in header
        else "|"
        if "|" in header
        else ","
        if "," in header
        else ""
    )
    if not used:
        return ""
    read_with = "','" if table.path.suffix.lower() == ".csv" else "a tab"
    return (
        f" The header is one column {header!r}: the file looks delimited by {used!r}, but "
        f"{table.path.suffix} is read with {read_with}; save it comma-separated as .csv or tab-separated as .tsv."
    )


def require_columns(table: TextTable, required: Sequence[str], expected: str) -> None:
    """Raise one ``ValueError`` line if ``table`` lacks a column of ``required``.

    The message names the columns the file has, a close spelling ("did you mean"), and the ``columns``
    mapping that would read the file's columns under the required names.

    Args:
        table (TextTable): The table.
        required (Sequence[str]): The column names that must be present.
        expected (str): How to describe the valid columns, e.g. ``"'text' and 'label'"``.
    """
    missing = [name for name in required if name not in table.columns]
    if not missing:
        return
    found = list(table.found) or sorted(table.columns)
    present = [name for name in required if name in table.columns]
    message = f"{table.name}: missing column {missing[0]!r}; expected {expected}, found {found}."
    suggestion = _suggested_map(table, missing, present)
    if suggestion:
        mapping = ", ".join(f"{role}: {column}" for role, column in {**table.renamed, **suggestion}.items())
        message += did_you_mean(missing[0], found)
        message += f" Read them with columns={{{mapping}}} (data.columns in a config)."
    else:
        message += _delimiter_hint(table) or (
            " Rename the file's columns, or map them with columns={"
            + ", ".join(f"{role}: <column>" for role in missing)
            + "} (data.columns in a config)."
        )
    raise ValueError(message)
