"""The corpus search of :class:`~composer_dynsample.samplers.mined_negatives.MinedNegativesPKBatchSampler`.

Each anchor's nearest passages of other pairs in a snapshot of the embeddings, with the false-negative
guards of ANCE / RocketQA (a rank window), NV-Retriever (a margin relative to the positive) and exact
duplicates (the same text). A fast float32 pass keeps :data:`~composer_dynsample.samplers._ranking.SLACK`
spare candidates, which are ranked again in float64 with ties in row order and then guarded
(:mod:`~composer_dynsample.samplers._candidate_screen`), so the lists are a pure function of the snapshot:
every rank computes the same ones.
"""

from __future__ import annotations

import importlib.util
import math
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import torch

from composer_dynsample.samplers._candidate_screen import _row_norms, _Screen
from composer_dynsample.samplers._candidates import GUARDS, CorpusCandidates
from composer_dynsample.samplers._ivf import InvertedFileIndex
from composer_dynsample.samplers._ranking import SLACK
from composer_dynsample.validation import check_choice, check_float, check_int

__all__ = [
    "CORPUS_SEARCHES",
    "GUARDS",
    "check_corpus_search",
    "corpus_candidates",
    "pair_layout",
]

_SIMILARITY_BUDGET = 2**25  # float32 entries of one chunk's similarity block: 128 MiB
# Anchors per faiss call: faiss blocks its own similarities, and its flat index is about 9 times slower
# per anchor when called with a few dozen (measured at 100,000 x 128 on one thread).
_FAISS_QUERIES = 1024
_IVF_PROBES = 32  # faiss IVF cells searched per query, of about sqrt(N)
#: Valid values of ``search`` for :func:`corpus_candidates` (and the mined-negatives sampler).
CORPUS_SEARCHES = ("auto", "exact", "ivf", "faiss", "faiss_ivf")
_FAISS_SEARCHES = ("faiss", "faiss_ivf")
# Up to this many passages with an embedding, ``search="auto"`` is exact, above it the own IVF (which
# needs no faiss). benchmarks/corpus_negatives.py, 2 threads: at 10,000 pairs both refresh in under a
# second; at 100,000 exact takes 57 s against 2.9 s (window recall 0.96); at 1,000,000 the IVF 27 s.
EXACT_SEARCH_MAX_PASSAGES = 50_000
_IVF_QUERIES = 1 << 17  # anchors per scan of the own IVF: about 100 MiB of queries and running top-k
_RERANK_ANCHORS = 256  # anchors per float64 rerank: their candidate rows stay in a core's cache
_CALIBRATION_ANCHORS = 256  # anchors the own IVF searches exactly to choose its probes


def pair_layout(labels: np.ndarray, is_passage: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The anchor row and the positive row of every pair, and the pair of every row.

    Pairs are numbered by sorted label. Every label must have exactly two rows, one anchor
    (``is_passage`` false) and one passage (its positive).

    Args:
        labels (numpy.ndarray): ``(N,)`` int64, the pair of every row.
        is_passage (numpy.ndarray): ``(N,)`` bool, which rows are passages.

    Returns:
        tuple[numpy.ndarray, numpy.ndarray, numpy.ndarray]: ``anchors`` ``(C,)``, ``positives`` ``(C,)`` and
        ``pair_of`` ``(N,)``, int64.

    Example:
        >>> anchors, positives, pair_of = pair_layout(np.array([7, 3, 7, 3]), np.array([0, 1, 1, 0], bool))
        >>> anchors.tolist(), positives.tolist(), pair_of.tolist()
        ([3, 0], [1, 2], [1, 0, 1, 0])
    """
    classes, pair_of, counts = np.unique(labels, return_inverse=True, return_counts=True)
    if (counts != 2).any():
        bad = int(np.flatnonzero(counts != 2)[0])
        raise ValueError(
            f"labels must give every pair exactly 2 rows (an anchor and its positive); label "
            f"{int(classes[bad])} has {int(counts[bad])}."
        )
    passages = np.bincount(pair_of, weights=is_passage, minlength=classes.size)
    if (passages != 1).any():
        bad = int(np.flatnonzero(passages != 1)[0])
        kind = "2 passages" if passages[bad] == 2 else "no passage"
        raise ValueError(
            f"every pair needs one anchor (is_passage false) and one passage (is_passage true); label "
            f"{int(classes[bad])} has {kind}."
        )
    order = np.lexsort((is_passage, pair_of))  # per pair: the anchor, then the passage
    return order[0::2].astype(np.int64), order[1::2].astype(np.int64), pair_of.astype(np.int64)


def dense_ids(duplicate_ids: np.ndarray | None, size: int) -> np.ndarray:
    """Duplicate ids renumbered ``0 .. U-1`` (equal ids stay equal), or every row its own id."""
    if duplicate_ids is None:
        return np.arange(size, dtype=np.int64)
    return np.unique(duplicate_ids, return_inverse=True)[1].astype(np.int64).reshape(-1)


def check_corpus_search(search: object) -> str:
    """Validate a corpus ``search`` (one of :data:`CORPUS_SEARCHES`) and, for a faiss one, that faiss is
    installed; raise a one-line error saying what would work otherwise."""
    check_choice("search", search, CORPUS_SEARCHES)
    if search in _FAISS_SEARCHES and importlib.util.find_spec("faiss") is None:
        raise ImportError(
            f"search={search!r} needs faiss, which is not installed: pip install 'composer-dynsample[faiss]' "
            "(faiss-cpu), or use search='ivf' (approximate) or 'exact'."
        )
    return str(search)


def corpus_candidates(
    embeddings: torch.Tensor,
    labels: Sequence[int] | np.ndarray,
    is_passage: Sequence[bool] | np.ndarray,
    window: int,
    *,
    skip_top: int = 0,
    max_relative_similarity: float | None = None,
    absolute_margin: float | None = None,
    duplicate_ids: np.ndarray | None = None,
    valid: torch.Tensor | np.ndarray | None = None,
    pairs: np.ndarray | None = None,
    chunk_size: int | None = None,
    search: str = "exact",
    device: torch.device | str | None = None,
) -> CorpusCandidates:
    """Each anchor's nearest passages of other pairs by cosine similarity, through false-negative guards.

    The passages with an embedding are ranked by their similarity to the anchor, its own positive left
    out. The ``skip_top`` nearest are skipped (the rank window: the very nearest are the likeliest
    unlabelled positives), and of the next ``window`` a candidate is dropped when its text (its
    ``duplicate_ids`` entry) is the anchor's or the positive's (``"duplicate"``), when it is the
    positive of another pair whose anchor has the anchor's text (``"same_query"``: the same query with
    another answer), or when its similarity exceeds ``max_relative_similarity`` times the anchor's
    similarity to its positive (``"margin"``, NV-Retriever's TopK-PercPos) or is within ``absolute_margin``
    of it (sentence-transformers' ``absolute_margin``: kept only if ``similarity + absolute_margin <=
    positive's``; also ``"margin"``). Rows without an embedding
    (``valid`` false, a non-finite or a zero row) are no candidate, and their anchors get none.

    Searches (every one keeps 8 spare candidates, ranked again in float64 with ties in row order):
    ``"exact"`` compares a chunk of anchors with every passage in torch (memory ``chunk_size x
    passages``); ``"ivf"`` is the project's own approximate inverted-file search in torch
    (:class:`~composer_dynsample.samplers._ivf.InvertedFileIndex`: about ``sqrt(8 N)`` k-means cells,
    the probes measured on 256 anchors searched exactly so that their cells hold 95% of those anchors'
    nearest passages); ``"auto"`` is ``"exact"`` up to 50,000 passages with an embedding and ``"ivf"``
    above; ``"faiss"`` uses faiss's exact ``IndexFlatIP`` (the same lists as ``"exact"``);
    ``"faiss_ivf"`` faiss's approximate ``IndexIVFFlat`` (about ``sqrt(N)`` cells, 32 searched per
    anchor). The faiss searches need the ``faiss`` extra. Memory is linear in the number of rows.

    Args:
        embeddings (torch.Tensor): ``(N, D)`` embeddings, one row per row of ``labels``.
        labels (Sequence[int] | numpy.ndarray): ``(N,)`` the pair of every row (see :func:`pair_layout`).
        is_passage (Sequence[bool] | numpy.ndarray): ``(N,)`` which rows are passages.
        window (int): Candidates looked at after the skipped ones.
        skip_top (int): The nearest passages skipped. Default: ``0``.
        max_relative_similarity (float, optional): The margin guard's fraction. Default: ``None`` (off).
        absolute_margin (float, optional): The margin guard's gap below the positive's similarity (``0``: never
            more similar than the positive). Default: ``None`` (off).
        duplicate_ids (numpy.ndarray, optional): ``(N,)`` integer id of every row's text (equal texts,
            equal ids). Default: none (no duplicate or same-query guard).
        valid (torch.Tensor | numpy.ndarray, optional): ``(N,)`` bool, the rows holding an embedding.
            Default: every finite row.
        pairs (numpy.ndarray, optional): The pairs (numbered by sorted label) whose anchors to search.
            Default: all.
        chunk_size (int, optional): Anchors per similarity block. Default: about 128 MiB of similarities
            for ``"exact"`` (at most 1024 anchors), 1024 anchors per call for the faiss searches, 131,072
            per scan for ``"ivf"``.
        search (str): One of :data:`CORPUS_SEARCHES`: ``"auto"``, ``"exact"``, ``"ivf"``, ``"faiss"`` or
            ``"faiss_ivf"``. Default: ``"exact"``.
        device (torch.device | str, optional): Where the ``"exact"`` and ``"ivf"`` searches run (a CUDA
            device: the passage matrix and the similarity blocks live there); the float64 rerank and the
            guards stay on the CPU. Default: the CPU.

    Returns:
        CorpusCandidates: The passage rows examined, which passed, what each guard dropped, which anchors
        were searched, the candidates' similarities and each anchor's similarity to its positive.

    Example:
        >>> x = torch.tensor([[1.0, 0.0], [1.0, 0.1], [0.0, 1.0], [0.9, 0.5], [0.8, 0.6], [0.0, 1.0]])
        >>> found = corpus_candidates(x, [0, 0, 1, 1, 2, 2], [False, True] * 3, 2)
        >>> found.survivors()[:, :2].tolist()
        [[3, 5], [5, 1], [3, 1]]
    """
    check_int("window", window, minimum=1)
    check_int("skip_top", skip_top, minimum=0)
    search = check_corpus_search(search)
    if max_relative_similarity is not None:
        check_float("max_relative_similarity", max_relative_similarity, minimum=0, strict_minimum=True)
    if absolute_margin is not None:
        check_float("absolute_margin", absolute_margin)
    guarded = max_relative_similarity is not None or absolute_margin is not None
    labels, is_passage = np.asarray(labels, dtype=np.int64), np.asarray(is_passage, dtype=bool)
    base = embeddings.detach().cpu()
    anchors, positives, pair_of = pair_layout(labels, is_passage)
    usable = _usable_rows(base, valid)
    pairs = np.arange(anchors.size) if pairs is None else np.asarray(pairs, dtype=np.int64)
    searched = usable[anchors[pairs]] & (usable[positives[pairs]] | (not guarded))
    database = np.flatnonzero(usable[positives])  # pairs whose passage has an embedding
    column_of = np.full(anchors.size, -1, dtype=np.int64)
    column_of[database] = np.arange(database.size)
    if search == "auto":
        search = "exact" if database.size <= EXACT_SEARCH_MAX_PASSAGES else "ivf"
    width = skip_top + window
    # The calibration anchors of "ivf": a seeded sample of every pair's anchor, so the probes are a
    # function of the snapshot alone, not of the pairs searched.
    calibration = _calibration(base, anchors, usable, column_of) if search == "ivf" else None
    unit = _unit_rows(base, positives[database])
    find = _finder(
        search, unit, torch.device("cpu" if device is None else device), calibration, width + SLACK
    )
    del unit  # the finders keep what they need: the IVF its own copy, cell after cell
    screen = _Screen(
        base, dense_ids(duplicate_ids, labels.size), (anchors, positives, pair_of), skip_top, width
    )
    screen.margin, screen.gap = max_relative_similarity, absolute_margin
    step = check_int("chunk_size", chunk_size or _default_step(search, database.size), minimum=1)
    found = _search_all(
        find, screen, (pairs, np.flatnonzero(searched), column_of, positives[database]), step, searched
    )
    found.positive[~usable[positives[pairs]]] = np.nan  # no embedding: no similarity to it
    return found


def _default_step(search: str, passages: int) -> int:
    """Anchors per call of the finder: a similarity block of ``"exact"``, a faiss call, an IVF scan."""
    if search == "exact":
        return max(1, min(1024, _SIMILARITY_BUDGET // max(1, passages)))
    return _IVF_QUERIES if search == "ivf" else _FAISS_QUERIES


def _search_all(
    find: Callable[..., np.ndarray],
    screen: _Screen,
    layout: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray],
    step: int,
    searched: np.ndarray,
) -> CorpusCandidates:
    """Find the candidates of the ``searched`` anchors ``step`` at a time (torch, on its threads), then
    rerank and guard them in blocks of :data:`_RERANK_ANCHORS` on as many threads (numpy: each block
    alike on any). One after the other: torch's threads would wait on busy cores for every operation."""
    pairs, queries, column_of, database_rows = layout
    out = CorpusCandidates(
        np.full((pairs.size, screen.width), -1, dtype=np.int64),
        np.zeros((pairs.size, screen.width), dtype=bool),
        np.zeros((pairs.size, len(GUARDS)), dtype=np.int64),
        searched,
        np.full((pairs.size, screen.width), -np.inf),
        np.full(pairs.size, np.nan),
    )
    if queries.size * (screen.width + SLACK) > screen.base.shape[0]:  # each row gathered more than once
        screen.norms = _row_norms(screen.base)
    cells = None
    if isinstance(find, InvertedFileIndex):  # anchors in cell order: a block probes few cells
        blocks = range(0, queries.size, 65536)
        order, cells = find.cell_order(
            _unit_rows(screen.base, screen.anchors[pairs[queries[b : b + 65536]]]) for b in blocks
        )
        queries = queries[order]
    with ThreadPoolExecutor(max_workers=max(1, torch.get_num_threads())) as pool:
        for start in range(0, queries.size, step):
            at = queries[start : start + step]
            own = pairs[at]
            query, columns = _unit_rows(screen.base, screen.anchors[own]), torch.from_numpy(column_of[own])
            known = {} if cells is None else {"nearest": cells[start : start + step]}  # the IVF's cells
            found = find(query, columns, screen.width + SLACK, **known)
            rows = np.where(found >= 0, database_rows[np.maximum(found, 0)], -1)
            blocks = [slice(b, b + _RERANK_ANCHORS) for b in range(0, at.size, _RERANK_ANCHORS)]
            done = pool.map(screen, [own[block] for block in blocks], [rows[block] for block in blocks])
            for block, (ranked, kept, dropped, values, positive) in zip(blocks, done, strict=True):
                out.ranked[at[block]], out.kept[at[block]], out.dropped[at[block]] = ranked, kept, dropped
                out.similarity[at[block]], out.positive[at[block]] = values, positive  # type: ignore[index]
    return out


def _calibration(
    base: torch.Tensor, anchors: np.ndarray, usable: np.ndarray, column_of: np.ndarray
) -> tuple[torch.Tensor, torch.Tensor]:
    """Up to :data:`_CALIBRATION_ANCHORS` anchors with an embedding, seeded, as unit rows, and their own
    positive's column (``-1``: none)."""
    pairs = np.flatnonzero(usable[anchors])
    rng = np.random.default_rng(0)
    chosen = np.sort(rng.choice(pairs, size=min(_CALIBRATION_ANCHORS, pairs.size), replace=False))
    return _unit_rows(base, anchors[chosen]), torch.from_numpy(column_of[chosen])


def _unit_rows(base: torch.Tensor, rows: np.ndarray) -> torch.Tensor:
    """``base[rows]`` in float32, each row scaled to unit length."""
    return torch.nn.functional.normalize(torch.index_select(base, 0, torch.from_numpy(rows)).float(), dim=1)


def _usable_rows(base: torch.Tensor, valid: torch.Tensor | np.ndarray | None) -> np.ndarray:
    """Rows with an embedding: ``valid`` (default all) and finite and not zero."""
    usable = np.empty(base.shape[0], dtype=bool)
    for start in range(0, base.shape[0], 8192):  # blocks: no temporary of the table's size
        block = base[start : start + 8192].float()
        usable[start : start + 8192] = (
            torch.isfinite(block).all(dim=1) & (block.abs().sum(dim=1) > 0)
        ).numpy()
    if valid is not None:
        given = valid.cpu().numpy() if isinstance(valid, torch.Tensor) else np.asarray(valid)
        if given.shape != usable.shape:
            raise ValueError(f"valid must have shape {usable.shape}, got {given.shape}.")
        usable &= given.astype(bool)
    return usable


def _finder(
    search: str,
    fast: torch.Tensor,
    device: torch.device,
    calibration: tuple[torch.Tensor, torch.Tensor] | None,
    neighbours: int,
) -> Callable[[torch.Tensor, torch.Tensor, int], np.ndarray]:
    """``find(queries, own, width)``: each query's ``width`` most similar database columns by float32
    similarity, its ``own`` column (``-1``: none) left out, ``-1`` where there are fewer."""
    if search == "ivf":
        return InvertedFileIndex(fast, sample=calibration, neighbours=neighbours, device=device)
    if search == "exact":
        fast = fast.to(device)

        def find_exact(queries: torch.Tensor, own: torch.Tensor, width: int) -> np.ndarray:
            own = own.to(device)
            similarity = queries.to(device) @ fast.T
            has = torch.nonzero(own >= 0).flatten()
            similarity[has, own[has]] = float("-inf")
            values, columns = similarity.topk(min(width, fast.shape[0]), dim=1, sorted=False)
            return torch.where(torch.isfinite(values), columns, -1).cpu().numpy()

        return find_exact
    index = _faiss_index(search, fast)
    fewest = _blas_queries(fast.shape[1]) if search == "faiss" else 0

    def find_faiss(queries: torch.Tensor, own: torch.Tensor, width: int) -> np.ndarray:
        asked = min(width + 1, fast.shape[0])  # one more: the query's own passage may be among them
        data = queries.numpy()
        if fewest > data.shape[0] >= fewest // 8:  # padded with copies: one matrix product costs less
            data = np.concatenate([data, np.repeat(data[:1], fewest - data.shape[0], axis=0)])
        found = index.search(np.ascontiguousarray(data), asked)[1][: queries.shape[0]]
        columns = found.astype(np.int64)
        columns[columns == own.numpy()[:, None]] = -1
        order = np.argsort(columns < 0, axis=1, kind="stable")  # found ones first, in order
        return np.take_along_axis(columns, order, axis=1)[:, :width]

    return find_faiss


def _blas_queries(dim: int) -> int:
    """The fewest queries for which faiss's flat index multiplies matrices (``nq x dim`` at least its
    ``distance_compute_blas_threshold``); below, it compares query by query, about 15 times slower at
    1,000,000 x 128 on one thread."""
    import faiss

    return -(-int(faiss.cvar.distance_compute_blas_threshold) // max(1, dim))


def _faiss_index(search: str, fast: torch.Tensor) -> Any:
    """A faiss inner-product index of the database rows: exact flat, or IVF."""
    import faiss

    data = np.ascontiguousarray(fast.numpy())
    dim = data.shape[1]
    if search == "faiss":
        index = faiss.IndexFlatIP(dim)
    else:
        cells = max(1, min(round(math.sqrt(data.shape[0])), data.shape[0] // 39))  # faiss wants 39 per cell
        index = faiss.IndexIVFFlat(faiss.IndexFlatIP(dim), dim, cells, faiss.METRIC_INNER_PRODUCT)
        index.cp.niter, index.cp.max_points_per_centroid = 10, 64  # k-means on a sample: seconds
        index.train(data)
        index.nprobe = min(_IVF_PROBES, cells)
    index.add(data)
    return index
