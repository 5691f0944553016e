"""Text pairs (retrieval, paraphrase, code search): an anchor, its positive, and optional given negatives.

The input is a table with sentence-transformers' columns: ``anchor``, ``positive`` and optionally
``negative`` and/or ``negative_1`` .. ``negative_n`` (a JSON or ``datasets`` cell may also hold a list
of negatives); formats as :func:`~composer_dynsample.data.text.table.read_text_tables` reads them
(JSON Lines, CSV, TSV, Parquet, a ``save_to_disk`` folder). Other columns are ignored, except the one
named by ``group``. Columns under other names are read through ``columns``: ``{"anchor": "query",
"positive": "pos"}`` (``data.columns`` in a config), for the training and the test file alike.

**A pair is a class of two samples**, so P x K samplers (K = 2), miners, InfoNCE and cross-rank pools
apply unchanged. Rows of a split's :class:`~composer_dynsample.data.text.store.TextStore`:

* rows ``2k`` and ``2k + 1`` are pair ``k``'s anchor (``is_query`` true) and positive, label
  ``offset + k``; these are the ``len(store)`` rows a sampler draws (``store.labels``);
* rows ``2P + j`` are the split's given negatives, label ``offset + P + j``: a label of their own, so a
  negative matches no row. No sampler sees them; the collate appends the negatives of the batch's
  anchors (:class:`~composer_dynsample.data.text.store.TextCollate`). An empty or ``null`` negative
  cell is no negative, counted in ``info.num_missing_negatives``.

``offset`` is 0 for the training split and the training split's label count for the test split.

The test split comes from ``test_path``, or the ``test`` split of a ``DatasetDict`` folder, or a seeded
split of the file: by the ``group`` column when given (whole groups go to the test split, so its groups
are unseen in training: groups are shuffled with ``seed`` and taken until the test split holds
``test_fraction`` of the pairs, at least one group and never all), else a seeded random split of pairs.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any, Unpack

import numpy as np

from composer_dynsample.data.text._sources import PairTokenizeKeywords, TokenizeOptions, check_loader_options
from composer_dynsample.data.text.columns import check_column_map
from composer_dynsample.data.text.pair_table import NEGATIVE_COLUMN, PairTable, read_pairs
from composer_dynsample.data.text.prompts import (
    check_prompts,
    column_prompt,
    prompt_token_count,
)
from composer_dynsample.data.text.store import TextInfo, TextSplits, TextStore
from composer_dynsample.data.text.table import (
    TextTable,
    read_text_tables,
    sort_key,
)
from composer_dynsample.data.text.tokenized import TokenStore
from composer_dynsample.data.text.tokenizer import TextTokenizer
from composer_dynsample.validation import check_keywords

__all__ = ["PairTable", "load_pairs", "read_pairs", "split_pairs"]


def _group_split(pairs: PairTable, test_fraction: float, seed: int) -> np.ndarray:
    groups = pairs.groups or []
    names = sorted(set(groups), key=sort_key)
    if len(names) < 2:
        raise ValueError(
            f"{pairs.table.path}: the group column holds {len(names)} distinct value(s); a group split needs at least 2."
        )
    index = {name: i for i, name in enumerate(names)}
    group_of = np.fromiter((index[g] for g in groups), dtype=np.int64, count=len(groups))
    sizes = np.bincount(group_of, minlength=len(names))
    target = int(np.floor(test_fraction * pairs.num_pairs + 0.5))
    chosen, count = [], 0
    for g in np.random.default_rng([seed, 0]).permutation(len(names)):
        if chosen and (count >= target or len(chosen) == len(names) - 1):
            break
        chosen.append(int(g))
        count += int(sizes[g])
    return np.isin(group_of, chosen)


def split_pairs(
    pairs: PairTable, test_fraction: float, seed: int, by_group: bool
) -> tuple[np.ndarray, np.ndarray]:
    """Sorted train and test pair indices: whole groups (see the module docstring) or a random split.

    Args:
        pairs (PairTable): The pairs; ``groups`` must be set for ``by_group``.
        test_fraction (float): The fraction of pairs in the test split, in ``(0, 1)``.
        seed (int): Seed of the split.
        by_group (bool): Split by group rather than by pair.

    Returns:
        tuple[np.ndarray, np.ndarray]: ``int64`` train and test indices, both non-empty.
    """
    if by_group:
        is_test = _group_split(pairs, test_fraction, seed)
    else:
        if pairs.num_pairs < 2:
            raise ValueError(f"{pairs.table.path}: holds {pairs.num_pairs} pair; a split needs at least 2.")
        num_test = min(max(1, int(np.floor(test_fraction * pairs.num_pairs + 0.5))), pairs.num_pairs - 1)
        is_test = np.zeros(pairs.num_pairs, bool)
        is_test[np.random.default_rng([seed, 0]).permutation(pairs.num_pairs)[:num_test]] = True
    return np.flatnonzero(~is_test).astype(np.int64), np.flatnonzero(is_test).astype(np.int64)


def _negative_selection(pairs: PairTable, chosen: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(counts per chosen pair, text indices of their negatives)``, vectorised."""
    starts = pairs.negative_offsets[chosen]
    counts = pairs.negative_offsets[chosen + 1] - starts
    total = int(counts.sum())
    before = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
    positions = np.arange(total, dtype=np.int64) - np.repeat(before, counts) + np.repeat(starts, counts)
    return counts, pairs.negative_texts[positions]


def pair_store(
    pairs: PairTable,
    chosen: np.ndarray,
    tokens: TokenStore,
    tokenizer: TextTokenizer,
    label_offset: int,
    passage: tuple[TokenStore, TextTokenizer] | None = None,
) -> TextStore:
    """The :class:`TextStore` of the ``chosen`` pairs, laid out as the module docstring says; with ``passage``
    (a second tokenizer's store of the same texts, and the tokenizer), the positives and negatives read it."""
    num = len(chosen)
    counts, negative_texts = _negative_selection(pairs, chosen)
    text_ids = np.concatenate(
        [np.stack([pairs.anchors[chosen], pairs.positives[chosen]], 1).reshape(-1), negative_texts]
    )
    labels = label_offset + np.concatenate(
        [np.repeat(np.arange(num), 2), num + np.arange(len(negative_texts))]
    )
    row_counts = np.zeros(2 * num, np.int64)
    row_counts[0::2] = counts  # an anchor's row carries its pair's negatives
    is_query = np.zeros(len(text_ids), bool)
    is_query[0 : 2 * num : 2] = True
    return TextStore(
        tokens,
        text_ids,
        labels,
        pad_id=tokenizer.pad_id,
        vocab_size=tokenizer.vocab_size,
        num_sampled=2 * num,
        is_query=is_query,
        negatives=(np.concatenate([[0], np.cumsum(row_counts)]), 2 * num + np.arange(len(negative_texts))),
        source_rows=np.concatenate([np.repeat(chosen, 2), np.repeat(chosen, counts)]),
        prompt_lengths=_prompt_lengths(
            pairs.prompts, tokenizer, num, len(negative_texts), passage and passage[1]
        ),
        passage_tokens=passage[0] if passage else None,
        passage_pad_id=passage[1].pad_id if passage else None,
    )


def _prompt_lengths(
    prompts: dict[str, str], tokenizer: TextTokenizer, num: int, negatives: int, passage: Any = None
) -> Any:
    """Each row's prompt tokens (anchor, positive, ..., then the negatives; the passages' by ``passage``,
    a second tokenizer, when given); ``None`` without prompts."""
    if not prompts:
        return None
    by = {"anchor": tokenizer, "positive": passage or tokenizer, "negative": passage or tokenizer}
    count = {column: prompt_token_count(column_prompt(prompts, column), by[column]) for column in by}
    pairs = np.tile([count["anchor"], count["positive"]], num)
    return np.concatenate([pairs, np.full(negatives, count["negative"])]).astype(np.int64)


def _training_texts(pairs: PairTable, chosen: np.ndarray) -> list[str]:
    """The texts of the chosen pairs in row order (anchor, positive, negatives), repeats kept."""
    texts = pairs.texts
    out: list[str] = []
    for k in chosen.tolist():
        out.append(texts[pairs.anchors[k]])
        out.append(texts[pairs.positives[k]])
        start, end = pairs.negative_offsets[k], pairs.negative_offsets[k + 1]
        out.extend(texts[i] for i in pairs.negative_texts[start:end].tolist())
    return out


def _split(
    pairs: PairTable,
    bundled: TextTable | None,
    test_path: str | os.PathLike[str] | None,
    group: str | None,
    test_fraction: float | None,
    seed: int,
) -> tuple[PairTable, np.ndarray, np.ndarray, str]:
    """``(test pairs, train indices, test indices, how)``: a separate test table, or a split of ``pairs``."""
    if test_path is None and bundled is None:
        fraction = 0.2 if test_fraction is None else test_fraction
        train_idx, test_idx = split_pairs(pairs, fraction, seed, group is not None)
        return pairs, train_idx, test_idx, "group" if group is not None else "random"
    if test_fraction is not None or group is not None:
        raise ValueError(
            f"{pairs.table.path}: the test split is {'test_path' if test_path is not None else 'its test split'}; "
            f"test_fraction and group split a single file and must be None, got {test_fraction!r} and {group!r}."
        )
    test_table = (
        read_text_tables(test_path, _pair_columns(None), pairs.table.renamed, own_names=True)[0]
        if test_path is not None
        else bundled
    )
    test_pairs = read_pairs(test_table, prompts=pairs.prompts)  # type: ignore[arg-type]
    split = "test_path" if test_path is not None else "bundled"
    return test_pairs, np.arange(pairs.num_pairs), np.arange(test_pairs.num_pairs), split


def _pair_columns(group: str | None) -> Callable[[str], bool]:
    def keep(column: str) -> bool:
        return column in ("anchor", "positive", group) or bool(NEGATIVE_COLUMN.match(column))

    return keep


def load_pairs(
    path: str | os.PathLike[str],
    *,
    test_path: str | os.PathLike[str] | None = None,
    group: str | None = None,
    test_fraction: float | None = None,
    seed: int = 0,
    max_length: int = 128,
    name: str | None = None,
    columns: Mapping[str, str] | None = None,
    prompts: Mapping[str, str] | None = None,
    **options: Unpack[PairTokenizeKeywords],
) -> TextSplits:
    """Load anchor/positive(/negative) pairs, tokenized once and cached (see the module docstring).

    Args:
        path (str | os.PathLike): The pairs: a JSON Lines, CSV, TSV or Parquet file, or a ``datasets`` folder.
        test_path (str | os.PathLike, optional): The test pairs, same format. Default: ``None`` (split ``path``).
        group (str, optional): A column whose values group the pairs (a repository, a package): the
            test split takes whole groups. Default: ``None`` (a random split of pairs).
        test_fraction (float, optional): The fraction of pairs held out when splitting ``path``, in
            ``(0, 1)``; must be ``None`` with a test file. Default: ``None`` (``0.2`` when splitting).
        seed (int): Seed of the split. Default: ``0``.
        max_length (int): Truncate texts to this many tokens, special tokens included, at least 2.
            Default: ``128``.
        name (str, optional): The name in the result, of both splits. Default: the file's stem, and the
            test file's (``test_path``) for the test split (``TextSplits.test_name``).
        columns (Mapping[str, str], optional): Read these columns under another name: ``anchor``,
            ``positive``, ``negative`` or ``negative_<n>`` to the file's column, e.g. ``{"anchor":
            "query", "positive": "pos"}``; the test file is read with the same mapping. Default: ``None``.
        prompts (Mapping[str, str], optional): A prompt to put before the texts of each column,
            ``anchor``, ``positive`` and ``negative`` (default: the positive's), of both files, e.g.
            ``{"anchor": "query: ", "positive": "passage: "}``
            (:mod:`~composer_dynsample.data.text.prompts`). Default: ``None`` (none).
        **options: How the texts are tokenized and cached (``tokenizer``, ``tokenizer_model``, ``vocab_size``,
            ``lowercase``, ``save_tokenizer``, ``cache_dir``, ``progress``, ``passage_tokenizer``), and their
            defaults, as :class:`~composer_dynsample.data.text._sources.TokenizeOptions` documents them. With
            ``passage_tokenizer`` (the passage tower's, when two towers tokenize otherwise) the texts are
            tokenized by both, and each row reads its side's ids (``TextStore.passage_tokens``).

    Returns:
        TextSplits: :class:`~composer_dynsample.data.text.store.TextStore` splits and their ``info``.

    Raises:
        FileNotFoundError: If ``path``, ``test_path`` or ``tokenizer`` does not exist.
        ValueError: One line naming the file, line and column of bad content, or the bad argument.

    Example:
        >>> import json, pathlib, tempfile
        >>> folder = pathlib.Path(tempfile.mkdtemp())
        >>> rows = [{"anchor": f"query {i}", "positive": f"answer {i}", "negative": f"other {i}"} for i in range(10)]
        >>> _ = (folder / "pairs.jsonl").write_text("".join(json.dumps(row) + "\\n" for row in rows))
        >>> splits = load_pairs(folder / "pairs.jsonl", vocab_size=64, cache_dir=folder / "cache")
        >>> len(splits.train), splits.train.num_rows, splits.train.labels[:4].tolist()
        (16, 24, [0, 0, 1, 1])
    """
    check_keywords("load_pairs", options, PairTokenizeKeywords)
    check_loader_options(max_length, test_fraction, seed)
    tokenize = TokenizeOptions(max_length, **options)
    names = check_column_map(columns, ("anchor", "positive", "negative"))
    prompts = check_prompts(prompts, columns=("anchor", "positive", "negative"))
    table, bundled = read_text_tables(path, _pair_columns(group), names)
    pairs = read_pairs(table, group, prompts)
    test_pairs, train_idx, test_idx, split = _split(pairs, bundled, test_path, group, test_fraction, seed)
    parts = [pairs] if test_pairs is pairs else [pairs, test_pairs]
    text_tokenizer, stores = tokenize.tokenize(parts, _training_texts(pairs, train_idx))
    second = tokenize.tokenize_passages(parts)
    passages = [None] * len(parts) if second is None else [(store, second[0]) for store in second[1]]
    train = pair_store(pairs, train_idx, stores[0], text_tokenizer, 0, passages[0])
    num_train_labels = train.num_rows - len(train) // 2  # a label per pair and per given negative
    test = pair_store(test_pairs, test_idx, stores[-1], text_tokenizer, num_train_labels, passages[-1])
    info = TextInfo.describe(
        text_tokenizer,
        stores,
        max_length,
        split,
        num_train_classes=num_train_labels,
        num_negatives=(train.num_rows - len(train), test.num_rows - len(test)),
        num_missing_negatives=sum(part.num_missing_negatives for part in parts),
        columns=names,
        files={part.table.name: part.table.sha256 for part in parts},
        prompts=prompts,
    )
    num_classes = num_train_labels + test.num_rows - len(test) // 2
    return TextSplits(
        train=train,
        test=test,
        num_classes=num_classes,
        name=name or table.path.stem,
        test_name=name or (test_pairs.table.path.stem if test_path is not None else ""),
        info=info,
    )
