"""Labelled texts (entity linking, intent matching): a ``text`` column and a ``label`` column.

Formats as :func:`~composer_dynsample.data.text.table.read_text_tables` reads them (JSON Lines, CSV,
TSV, Parquet, a ``save_to_disk`` folder); other columns are ignored, and ``columns`` reads the two under
other names (``{"text": "sentence", "label": "intent"}``, ``data.columns`` in a config). A label is any hashable value
(a name, a number, an identifier); labels are numbered in sorted order and their values kept in
``info.label_names`` (``label_names[label]`` is the original), numbers before strings when mixed.

Like :func:`~composer_dynsample.data.glyphs.load_glyphs`, the test split holds labels never seen in
training: the labels are shuffled with ``seed`` and ``test_fraction`` of them (rounded half up, at
least one, never all) go to the test split with all their texts. Labels are global: training labels
``0 .. T-1`` and test labels ``T .. C-1``, each range in sorted order of the originals. With
``test_path`` (or a ``DatasetDict`` folder's ``test`` split) the test texts come from there; the
training file's labels are ``0 .. T-1`` and labels found only in the test file follow, sorted.

Every row is one sample of its label (``is_query`` false); a label with a single text cannot fill a
P x K chunk of K >= 2, and the P x K sampler leaves it out with a warning.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from typing import Any, Unpack

import numpy as np

from composer_dynsample.data.text._sources import TokenizeKeywords, TokenizeOptions, check_loader_options
from composer_dynsample.data.text.columns import check_column_map, require_columns
from composer_dynsample.data.text.prompts import check_prompts, prompt_layout, prompt_token_count
from composer_dynsample.data.text.store import TextInfo, TextSplits, TextStore
from composer_dynsample.data.text.table import (
    TextTable,
    hashable_column,
    read_text_tables,
    sort_key,
    text_column,
)
from composer_dynsample.data.text.tokenized import TextInterner, TokenStore
from composer_dynsample.data.text.tokenizer import TextTokenizer
from composer_dynsample.validation import check_keywords

__all__ = ["load_texts", "split_labels"]

_COLUMNS = ("text", "label")


def split_labels(names: list[object], test_fraction: float, seed: int) -> tuple[list[object], list[object]]:
    """Split sorted label values into disjoint train and test labels, each sorted, from a seeded permutation.

    Args:
        names (list): The distinct labels, sorted.
        test_fraction (float): The fraction of labels in the test split, in ``(0, 1)``.
        seed (int): Seed of the permutation.

    Returns:
        tuple[list, list]: The train labels and the test labels, both non-empty.

    Example:
        >>> train, test = split_labels(list("abcdefghij"), 0.2, seed=0)
        >>> len(train), len(test), sorted(train + test) == list("abcdefghij")
        (8, 2, True)
    """
    if len(names) < 2:
        raise ValueError(f"an unseen-label split needs at least 2 distinct labels, got {len(names)}.")
    permutation = np.random.default_rng([seed, 0]).permutation(len(names))
    num_test = min(max(1, int(np.floor(test_fraction * len(names) + 0.5))), len(names) - 1)
    test = np.sort(permutation[:num_test])
    is_test = np.zeros(len(names), bool)
    is_test[test] = True
    return [n for n, t in zip(names, is_test) if not t], [n for n, t in zip(names, is_test) if t]


@dataclasses.dataclass(frozen=True, eq=False)
class _Labelled:
    """The rows of one table: each row's text and label, and the distinct texts (a ``TextSource``)."""

    table: TextTable
    row_texts: list[str]
    labels: list[Any]
    interner: TextInterner
    text_ids: np.ndarray
    prompt: str = ""

    @property
    def texts(self) -> list[str]:
        """The distinct texts, in order of first appearance."""
        return self.interner.texts

    @property
    def layout(self) -> str:
        """The column the texts come from: part of their token cache's key."""
        return "texts:text" + prompt_layout({"text": self.prompt} if self.prompt else {})

    def locate(self, text_id: int) -> str:
        """Where distinct text ``text_id`` first appears, for an error message."""
        return self.table.where(self.row_texts.index(self.interner.texts[text_id]), "text")


def _read(table: TextTable, prompt: str) -> _Labelled:
    require_columns(table, _COLUMNS, "columns 'text' and 'label'")
    texts: list[str] = [prompt + text for text in text_column(table, "text")]  # type: ignore[operator]
    labels = hashable_column(table, "label")
    interner = TextInterner()
    return _Labelled(table, texts, labels, interner, interner.add_all(texts), prompt)


def _test_table(
    table: TextTable,
    bundled: TextTable | None,
    test_path: str | os.PathLike[str] | None,
    test_fraction: float | None,
) -> TextTable | None:
    """The table of a separate test split (``test_path``, else a ``DatasetDict``'s ``test``), or ``None``."""
    if test_path is None and bundled is None:
        return None
    if test_fraction is not None:
        raise ValueError(
            f"{table.path}: the test split is {'test_path' if test_path is not None else 'its test split'}; "
            f"test_fraction splits a single file and must be None, got {test_fraction!r}."
        )
    return (
        read_text_tables(test_path, _keep, table.renamed, own_names=True)[0]
        if test_path is not None
        else bundled
    )


def _keep(column: str) -> bool:
    return column in _COLUMNS


def _number(
    train: _Labelled, test: _Labelled, test_fraction: float | None, seed: int
) -> tuple[tuple[Any, ...], int, np.ndarray, np.ndarray]:
    """``(label names, number of train labels, train row labels, test row labels)``; -1 for a held-out row."""
    names = sorted(set(train.labels), key=sort_key)
    if test is train:
        train_names, test_names = split_labels(names, 0.2 if test_fraction is None else test_fraction, seed)
    else:
        train_names, test_names = names, sorted(set(test.labels) - set(names), key=sort_key)
    label_names = (*train_names, *test_names)
    number = {value: i for i, value in enumerate(label_names)}
    train_labels = np.fromiter((number[v] for v in train.labels), np.int64, len(train.labels))
    test_labels = np.fromiter((number[v] for v in test.labels), np.int64, len(test.labels))
    return label_names, len(train_names), train_labels, test_labels


def _store(
    text_ids: np.ndarray,
    labels: np.ndarray,
    rows: np.ndarray,
    tokens: TokenStore,
    tokenizer: TextTokenizer,
    prompt: str = "",
) -> TextStore:
    lengths = np.full(len(rows), prompt_token_count(prompt, tokenizer), np.int64) if prompt else None
    return TextStore(
        tokens,
        text_ids[rows],
        labels[rows],
        pad_id=tokenizer.pad_id,
        vocab_size=tokenizer.vocab_size,
        source_rows=rows,
        prompt_lengths=lengths,
    )


def load_texts(
    path: str | os.PathLike[str],
    *,
    test_path: str | os.PathLike[str] | None = None,
    test_fraction: float | None = None,
    seed: int = 0,
    max_length: int = 128,
    name: str | None = None,
    columns: Mapping[str, str] | None = None,
    prompts: Mapping[str, str] | None = None,
    **options: Unpack[TokenizeKeywords],
) -> TextSplits:
    """Load labelled texts, tokenized once and cached, split by label (see the module docstring).

    Args:
        path (str | os.PathLike): The texts: a JSON Lines, CSV, TSV or Parquet file, or a ``datasets`` folder.
        test_path (str | os.PathLike, optional): The test texts, same format. Default: ``None`` (split ``path``).
        test_fraction (float, optional): The fraction of labels held out when splitting ``path``, in
            ``(0, 1)``; must be ``None`` with a test file. Default: ``None`` (``0.2`` when splitting).
        seed (int): Seed of the split. Default: ``0``.
        max_length (int): Truncate texts to this many tokens, special tokens included, at least 2.
            Default: ``128``.
        name (str, optional): The name in the result, of both splits. Default: the file's stem, and the
            test file's (``test_path``) for the test split (``TextSplits.test_name``).
        columns (Mapping[str, str], optional): Read ``text`` and/or ``label`` from columns of other names,
            e.g. ``{"text": "sentence", "label": "intent"}``; the test file is read with the same mapping.
            Default: ``None``.
        prompts (Mapping[str, str], optional): ``{"text": PROMPT}``: put ``PROMPT`` before every text
            (:mod:`~composer_dynsample.data.text.prompts`). Default: ``None`` (none).
        **options: How the texts are tokenized and cached (``tokenizer``, ``tokenizer_model``, ``vocab_size``,
            ``lowercase``, ``save_tokenizer``, ``cache_dir``, ``progress``), and their defaults, as
            :class:`~composer_dynsample.data.text._sources.TokenizeOptions` documents them.

    Returns:
        TextSplits: ``info.label_names`` maps each integer label back to the original.

    Raises:
        FileNotFoundError: If ``path``, ``test_path`` or ``tokenizer`` does not exist.
        ValueError: One line naming the file, line and column of bad content, or the bad argument.

    Example:
        >>> import pathlib, tempfile
        >>> folder = pathlib.Path(tempfile.mkdtemp())
        >>> rows = "".join(f"text {i} of {c},{c}\\n" for c in "abcde" for i in range(4))
        >>> _ = (folder / "intents.csv").write_text("text,label\\n" + rows)
        >>> splits = load_texts(folder / "intents.csv", vocab_size=64, cache_dir=folder / "cache")
        >>> len(splits.train), len(splits.test), splits.info.label_names
        (16, 4, ('a', 'b', 'd', 'e', 'c'))
    """
    check_keywords("load_texts", options, TokenizeKeywords)
    check_loader_options(max_length, test_fraction, seed)
    tokenize = TokenizeOptions(max_length, **options)
    prompts = check_prompts(prompts, columns=("text",))
    table, bundled = read_text_tables(path, _keep, check_column_map(columns, _COLUMNS))
    train = _read(table, prompts.get("text", ""))
    test_table = _test_table(table, bundled, test_path, test_fraction)
    test = _read(test_table, prompts.get("text", "")) if test_table is not None else train
    label_names, num_train, train_labels, test_labels = _number(train, test, test_fraction, seed)
    if test is train:
        train_rows, test_rows = (
            np.flatnonzero(train_labels < num_train),
            np.flatnonzero(train_labels >= num_train),
        )
    else:
        train_rows, test_rows = np.arange(len(train_labels)), np.arange(len(test_labels))
    parts = [train] if test is train else [train, test]
    text_tokenizer, stores = tokenize.tokenize(parts, [train.row_texts[i] for i in train_rows.tolist()])
    split = "labels" if test is train else "test_path" if test_path is not None else "bundled"
    info = TextInfo.describe(
        text_tokenizer,
        stores,
        max_length,
        split,
        label_names=label_names,
        num_train_classes=num_train,
        columns=table.renamed,
        files={part.table.name: part.table.sha256 for part in parts},
        prompts=prompts,
    )
    return TextSplits(
        train=_store(train.text_ids, train_labels, train_rows, stores[0], text_tokenizer, train.prompt),
        test=_store(test.text_ids, test_labels, test_rows, stores[-1], text_tokenizer, test.prompt),
        num_classes=len(label_names),
        name=name or table.path.stem,
        test_name=name or (test_table.path.stem if test_path is not None and test_table is not None else ""),
        info=info,
    )
