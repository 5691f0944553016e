"""A table's pairs read and checked: the anchor, positive and negative columns, their texts numbered.

:func:`read_pairs` turns a :class:`~composer_dynsample.data.text.table.TextTable` with sentence-transformers'
columns (``anchor``, ``positive``, optionally ``negative`` / ``negative_1`` .. ``negative_n``, a cell of
which may hold a list) into a :class:`PairTable`: each distinct text once (with its column's prompt before
it), the pairs as indices into them. :mod:`~composer_dynsample.data.text.pairs` splits and tokenizes them.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import numpy as np

from composer_dynsample.data.text.columns import require_columns
from composer_dynsample.data.text.prompts import column_prompt, prompt_layout
from composer_dynsample.data.text.table import TextTable, check_unicode, hashable_column, text_column
from composer_dynsample.data.text.tokenized import TextInterner

__all__ = ["NEGATIVE_COLUMN", "PairTable", "read_pairs"]

NEGATIVE_COLUMN = re.compile(r"negative(?:_(\d+))?$")  # negative, negative_1 .. negative_n
_EXPECTED = "columns 'anchor' and 'positive', optionally 'negative' or 'negative_1' .. 'negative_n'"


@dataclasses.dataclass(frozen=True, eq=False)
class PairTable:
    """The pairs of one table, with their texts numbered (a repeated text once).

    Attributes:
        table (TextTable): Where they were read from.
        texts (list[str]): The distinct texts, in order of first appearance (anchor, positive, negatives).
        anchors (np.ndarray): ``(P,)`` text index of each pair's anchor.
        positives (np.ndarray): ``(P,)`` text index of each pair's positive.
        negative_offsets (np.ndarray): ``(P + 1,)``: pair ``k``'s negatives are
            ``negative_texts[negative_offsets[k]:negative_offsets[k + 1]]``.
        negative_texts (np.ndarray): Text indices of all given negatives.
        negative_columns (tuple[str, ...]): The negative columns, in order.
        groups (list | None): Each pair's group, when a group column was read.
        num_missing_negatives (int): Empty or ``null`` negative cells.
        prompts (dict[str, str]): The prompt put before each column's texts
            (:mod:`~composer_dynsample.data.text.prompts`): ``texts`` hold ``prompt + text``.
    """

    table: TextTable
    texts: list[str]
    anchors: np.ndarray
    positives: np.ndarray
    negative_offsets: np.ndarray
    negative_texts: np.ndarray
    negative_columns: tuple[str, ...]
    groups: list[Any] | None
    num_missing_negatives: int
    prompts: dict[str, str] = dataclasses.field(default_factory=dict)

    @property
    def num_pairs(self) -> int:
        """The number of pairs."""
        return len(self.anchors)

    @property
    def layout(self) -> str:
        """The columns its texts come from, in order: part of their token cache's key."""
        columns = ",".join(["anchor", "positive", *self.negative_columns])
        return f"pairs:{columns}{prompt_layout(self.prompts)}"

    def locate(self, text_id: int) -> str:
        """Where text ``text_id`` first appears, for an error message."""
        text = self.texts[text_id]
        columns = ["anchor", "positive", *self.negative_columns]
        for row in range(self.num_pairs):
            for column in columns:
                value, prompt = self.table.columns[column][row], _prompt(self.prompts, column)
                if prompt + str(value) == text or (
                    isinstance(value, list) and text in [prompt + str(item) for item in value]
                ):
                    return self.table.where(row, column)
        return f"{self.table.path}: text {text_id}"


def _prompt(prompts: dict[str, str], column: str) -> str:
    """The prompt of a column of the table (``negative_<n>`` takes the negatives' prompt)."""
    return column_prompt(prompts, "negative" if NEGATIVE_COLUMN.match(column) else column)


def _negative_columns(table: TextTable) -> tuple[str, ...]:
    found = [(name, NEGATIVE_COLUMN.match(name)) for name in table.columns]
    numbered = [(int(m.group(1)) if m.group(1) else 0, name) for name, m in found if m]
    return tuple(name for _, name in sorted(numbered))


def _negative_cell(table: TextTable, row: int, column: str, value: Any) -> tuple[list[str], int]:
    """The negatives of one cell (a text, a list of texts, or nothing) and how many were missing."""
    values = value if isinstance(value, list) else [value]
    texts, missing = [], 0
    for item in values:
        if item is None or (isinstance(item, str) and not item.strip()):
            missing += 1
        elif isinstance(item, str):
            check_unicode(table, row, column, item)
            texts.append(item)
        else:
            raise ValueError(
                f"{table.where(row, column)}: expected a string or a list of strings, got {type(item).__name__}."
            )
    return texts, missing


def read_pairs(
    table: TextTable, group: str | None = None, prompts: dict[str, str] | None = None
) -> PairTable:
    """Check a table's pair columns and number its texts, each column's prompt put before them.

    Args:
        table (TextTable): The table.
        group (str, optional): A column to read as each pair's group. Default: ``None``.
        prompts (dict[str, str], optional): Checked prompts by column
            (:func:`~composer_dynsample.data.text.prompts.check_prompts`). Default: ``None`` (none).

    Returns:
        PairTable: The pairs.

    Raises:
        ValueError: Naming the file, line and column of a missing column, a missing or empty text, or a
            value of the wrong type.
    """
    required = ["anchor", "positive"] + ([group] if group is not None else [])
    require_columns(table, required, _EXPECTED + (f", and the group column {group!r}" if group else ""))
    anchors, positives = text_column(table, "anchor"), text_column(table, "positive")
    columns = _negative_columns(table)
    cells = [table.columns[column] for column in columns]
    interner, offsets, negatives, missing = TextInterner(), [0], [], 0
    prompts = dict(prompts or {})
    ask, say, tell = (column_prompt(prompts, column) for column in ("anchor", "positive", "negative"))
    anchor_ids = np.empty(table.num_rows, np.int64)
    positive_ids = np.empty(table.num_rows, np.int64)
    for row in range(table.num_rows):
        anchor_ids[row] = interner.add(ask + anchors[row])  # type: ignore[operator]
        positive_ids[row] = interner.add(say + positives[row])  # type: ignore[operator]
        for column, values in zip(columns, cells):
            texts, lost = _negative_cell(table, row, column, values[row])
            negatives.extend(interner.add(tell + text) for text in texts)
            missing += lost
        offsets.append(len(negatives))
    return PairTable(
        table=table,
        texts=interner.texts,
        anchors=anchor_ids,
        positives=positive_ids,
        negative_offsets=np.asarray(offsets, dtype=np.int64),
        negative_texts=np.asarray(negatives, dtype=np.int64),
        negative_columns=columns,
        groups=hashable_column(table, group) if group is not None else None,
        num_missing_negatives=missing,
        prompts=prompts,
    )
