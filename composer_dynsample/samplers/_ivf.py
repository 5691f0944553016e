"""The project's own inverted-file (IVF) search in torch: k-means cells, a few probed per query.

:func:`~composer_dynsample.samplers.hard_class.nearest_classes` cuts class centroids into cells with
:func:`_kmeans`, and :class:`InvertedFileIndex` searches a corpus of unit rows for
:func:`~composer_dynsample.samplers._corpus_search.corpus_candidates`: the rows are grouped by their
nearest k-means centre, each query compares itself only with the rows of its ``probes`` nearest cells,
and the scan goes cell by cell (every query probing a cell times the cell's rows in one matrix product),
so it is matrix products and top-k in torch, on every thread or on a CUDA device. Everything is seeded:
the cells, the probes and the candidates are a pure function of the data on a given machine.

Sizing, for ``N`` rows searched by about as many queries, in ``D`` dimensions: assigning the rows (and
the queries) to cells costs about ``N x cells x D`` each, the scan ``N x probes x N / cells x D``; their
sum is smallest at ``cells = sqrt(probes x N / 2)``, taken at :data:`NOMINAL_PROBES` (2,828 cells at
1,000,000 rows). From 1,024 cells on, a point finds its nearest centre in two levels (the centres cut into
about ``sqrt(cells)`` groups, a point compared with the centres of its 6 nearest groups only): about 4
times cheaper at 2,828 cells, the same centre as by brute force for 99.9% of the rows of clustered data.
The probes are then measured rather than guessed: a fixed sample of queries is searched exactly, and
the probes are the fewest (up to :data:`MAX_PROBES`) whose cells hold a :data:`RECALL_TARGET` share of
the sample's true nearest rows.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

import numpy as np
import torch

from composer_dynsample.validation import check_float, check_int

__all__ = ["MAX_PROBES", "NOMINAL_PROBES", "RECALL_TARGET", "InvertedFileIndex", "ivf_cells"]

#: The probes the number of cells is sized for (the cost is lowest for them).
NOMINAL_PROBES = 16
#: The most probes the calibration may choose (a bound on the cost when the data has no clusters).
MAX_PROBES = 64
#: The share of a calibration query's true nearest rows that its probed cells must hold, on average.
RECALL_TARGET = 0.95
_KMEANS_ITERATIONS = 10
_KMEANS_POINTS_PER_CELL = 32
_IVF_KMEANS_ITERATIONS = 5  # the corpus IVF: a fixed subsample of 32 rows per cell, 5 rounds
_BLOCK = 2048  # queries (or rows) per block of distances to every centre: 23 MiB at 2,828 cells
_TWO_LEVEL_BLOCK = 32768  # points per block of the two-level search of the nearest centre
_TWO_LEVEL_CELLS = 1024  # from this many cells on, the nearest centre is found in two levels
_GROUPS_SEARCHED = 6  # the nearest groups of centres whose centres a point is compared with
_OTHER_CELLS = 2 * MAX_PROBES  # a query's other probes: the nearest of these cells around its own
_SIMILARITY_BUDGET = 2**25  # float32 entries of one block of the exact calibration search: 128 MiB


def ivf_cells(size: int, probes: int = NOMINAL_PROBES) -> int:
    """The cells of an IVF over ``size`` rows: ``sqrt(probes x size / 2)``, at least ``32`` rows a cell.

    Example:
        >>> ivf_cells(1_000_000), ivf_cells(20_000), ivf_cells(10)
        (2828, 400, 1)
    """
    check_int("size", size, minimum=0)
    return max(1, min(round(math.sqrt(probes * size / 2)), size // _KMEANS_POINTS_PER_CELL))


def _kmeans(
    points: torch.Tensor,
    cells: int,
    iterations: int = _KMEANS_ITERATIONS,
    points_per_cell: int = _KMEANS_POINTS_PER_CELL,
    assign: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
) -> torch.Tensor:
    """``cells`` k-means centres of float32 ``points``: seeded start, fixed iterations, float64 sums in a
    fixed order; each round assigns the points with ``assign(points, centres)`` (default: brute force)."""
    order = torch.randperm(points.shape[0], generator=torch.Generator().manual_seed(0))
    points = points[
        order[: points_per_cell * cells].to(points.device)
    ]  # a fixed subsample trains the centres
    centres = points[:cells].clone()
    data = points.double().cpu().numpy()
    for _ in range(iterations):
        assign_to = (assign or _nearest_centre)(points, centres).cpu().numpy()
        order = np.argsort(assign_to, kind="stable")
        sizes = np.bincount(assign_to, minlength=cells)
        filled = np.flatnonzero(sizes)
        sums = np.add.reduceat(data[order], (np.cumsum(sizes) - sizes)[filled], axis=0)
        new = torch.from_numpy(sums / sizes[filled, None]).float().to(centres.device)
        centres[torch.from_numpy(filled).to(centres.device)] = new
    return centres


def _nearest_centre(points: torch.Tensor, centres: torch.Tensor, chunk_size: int = _BLOCK) -> torch.Tensor:
    """The index of each point's nearest centre (float32; the lowest index among equals)."""
    centre_norms = (centres * centres).sum(dim=1)
    return torch.cat(
        [_argmin_rows(_distances(block, centres, centre_norms)) for block in points.split(chunk_size)]
    )


def _nearest_in_two_levels(points: torch.Tensor, centres: torch.Tensor) -> torch.Tensor:
    """Each point's nearest centre, in two levels from :data:`_TWO_LEVEL_CELLS` centres on."""
    if centres.shape[0] < _TWO_LEVEL_CELLS:
        return _nearest_centre(points, centres)
    return _CentreGroups(centres).nearest(points)


def _distances(block: torch.Tensor, centres: torch.Tensor, centre_norms: torch.Tensor) -> torch.Tensor:
    """``|c|^2 - 2 q.c`` of every query of ``block`` and centre: the squared distance less ``|q|^2``
    (the same for every centre of a query, so it changes no order). In place: one temporary."""
    return (block @ centres.T).mul_(-2).add_(centre_norms)


def _argmin_rows(values: torch.Tensor) -> torch.Tensor:
    """Each row's first smallest column; numpy's on the CPU (vectorised: 10 times torch's there)."""
    if values.device.type == "cpu":
        return torch.from_numpy(values.numpy().argmin(axis=1).astype(np.int64))
    return values.argmin(dim=1)


def _runs(keys: torch.Tensor, count: int) -> tuple[torch.Tensor, list[tuple[int, int, int]]]:
    """The items of ``keys`` (values in ``[0, count)``) sorted by key, stable, and ``(key, low, high)``
    for every key present: its items are ``order[low:high]``."""
    order = torch.argsort(keys, stable=True)
    counts = torch.bincount(keys, minlength=count)
    present = torch.nonzero(counts).flatten()
    ends = torch.cumsum(counts[present], 0).tolist()
    return order, list(zip(present.tolist(), [0, *ends[:-1]], ends, strict=True))


class _CentreGroups:
    """The centres cut into about ``sqrt(cells)`` groups by a k-means of the centres: a point is compared
    with the group centres, then only with the centres of its :data:`_GROUPS_SEARCHED` nearest groups."""

    def __init__(self, centres: torch.Tensor) -> None:
        self.centres, self.count = centres, max(1, round(math.sqrt(centres.shape[0])))
        self.tops = _kmeans(centres, self.count, _IVF_KMEANS_ITERATIONS, points_per_cell=centres.shape[0])
        self.top_norms = (self.tops * self.tops).sum(dim=1)
        group = _nearest_centre(centres, self.tops)
        self.members = torch.argsort(group, stable=True)  # the centres group after group
        self.grouped = centres[self.members]
        self.grouped_norms = (self.grouped * self.grouped).sum(dim=1)
        self.ends = torch.cumsum(torch.bincount(group, minlength=self.count), 0).tolist()
        self.starts = [0, *self.ends[:-1]]

    def nearest(self, points: torch.Tensor) -> torch.Tensor:
        """Each point's nearest centre among those of its nearest groups."""
        return torch.cat([self._nearest(block) for block in points.split(_TWO_LEVEL_BLOCK)])

    def _nearest(self, block: torch.Tensor) -> torch.Tensor:
        searched = min(_GROUPS_SEARCHED, self.count)
        groups = _distances(block, self.tops, self.top_norms).topk(searched, dim=1, largest=False).indices
        best = torch.full((block.shape[0],), float("inf"), device=block.device)
        which = torch.full((block.shape[0],), -1, dtype=torch.int64, device=block.device)
        order, runs = _runs(groups.flatten(), self.count)
        for group, low, high in runs:
            who, start, end = order[low:high] // searched, self.starts[group], self.ends[group]
            if end > start:
                grouped, norms = self.grouped[start:end], self.grouped_norms[start:end]
                values, chosen = _distances(block.index_select(0, who), grouped, norms).min(dim=1)
                before = best.index_select(0, who)
                better = values < before
                best.index_copy_(0, who, torch.where(better, values, before))
                chosen = torch.where(better, self.members[start + chosen], which.index_select(0, who))
                which.index_copy_(0, who, chosen)
        missing = torch.nonzero(which < 0).flatten()  # every searched group empty: brute force
        if missing.numel():
            which[missing] = _nearest_centre(block[missing], self.centres)
        return which


class InvertedFileIndex:
    """An inverted-file index of unit rows: ``find(queries, own, width)`` their most similar rows.

    The rows are cut into :func:`ivf_cells` cells by a k-means on a fixed subsample (32 rows a cell, 5
    rounds) and stored cell after cell. A query probes its nearest cell and, with more probes, the
    nearest of the 127 cells around that one, by Euclidean distance to the centres (as the rows were
    assigned). The scan multiplies, one cell at a time, the queries probing it by its rows in one matrix
    product: first every query's nearest cell, whose top-k gives each query a floor, then the other
    probed cells, where only the queries with a row above their floor merge the block into their top-k.
    Memory is the rows, one block of queries and its top-k. Without ``probes`` the index measures them on
    ``sample`` queries (default: a seeded sample of its own rows, each leaving itself out): the fewest
    probes, up to :data:`MAX_PROBES`, whose cells hold ``recall`` of the sample's ``neighbours`` nearest
    rows on average.

    Args:
        database (torch.Tensor): ``(N, D)`` float rows, of unit length for cosine similarity.
        cells (int, optional): The number of cells. Default: :func:`ivf_cells` of ``N``.
        probes (int, optional): The cells each query searches. Default: measured, as above.
        sample (tuple[torch.Tensor, torch.Tensor], optional): Calibration queries ``(S, D)`` and the row
            each leaves out ``(S,)`` (``-1``: none). Default: up to 256 rows of ``database``.
        neighbours (int): The nearest rows the calibration counts per query. Default: ``32``.
        recall (float): The calibration's target, in ``(0, 1]``. Default: :data:`RECALL_TARGET`.
        device (torch.device | str, optional): Where the search runs. Default: the CPU.

    Example:
        >>> rows = torch.nn.functional.normalize(torch.randn(2000, 8, generator=torch.Generator().manual_seed(0)), dim=1)
        >>> index = InvertedFileIndex(rows, probes=4)
        >>> found = index(rows[:3], torch.tensor([0, 1, 2]), 5)
        >>> found.shape, bool((found != [[0], [1], [2]]).all())
        ((3, 5), True)
    """

    def __init__(
        self,
        database: torch.Tensor,
        *,
        cells: int | None = None,
        probes: int | None = None,
        sample: tuple[torch.Tensor, torch.Tensor] | None = None,
        neighbours: int = 32,
        recall: float = RECALL_TARGET,
        device: torch.device | str | None = None,
    ) -> None:
        self.device = torch.device("cpu") if device is None else torch.device(device)
        data = database.detach().to(self.device, torch.float32)
        size = data.shape[0]
        self.cells = (
            ivf_cells(size) if cells is None else min(check_int("cells", cells, minimum=1), max(1, size))
        )
        centres = data.new_zeros(1, data.shape[1])
        if size:
            centres = _kmeans(data, self.cells, _IVF_KMEANS_ITERATIONS, assign=_nearest_in_two_levels)
        self.centres, self.centre_norms = centres, (centres * centres).sum(dim=1)
        self.groups = _CentreGroups(centres) if self.cells >= _TWO_LEVEL_CELLS else None
        cell_of = self.nearest_cell(data)
        order = torch.argsort(cell_of, stable=True)
        self.rows, self.ids = data[order], order  # the rows cell after cell, and their row numbers
        self.position = torch.empty_like(order)
        self.position[order] = torch.arange(size, device=self.device)
        self.cell_of = cell_of[order]  # the cell of every stored position
        self.ends = torch.cumsum(torch.bincount(cell_of, minlength=self.cells), 0).tolist()
        self.starts = [0, *self.ends[:-1]]
        # Every cell's nearest cells, itself first: where its queries take their other probes.
        between = _distances(centres, centres, self.centre_norms).fill_diagonal_(float("-inf"))
        self.near = between.topk(min(_OTHER_CELLS, self.cells), dim=1, largest=False).indices
        if probes is not None:
            self.probes = min(check_int("probes", probes, minimum=1), self.near.shape[1])
        else:
            check_float("recall", recall, minimum=0, maximum=1, strict_minimum=True)
            self.probes = self._calibrate(sample, check_int("neighbours", neighbours, minimum=1), recall)

    def __call__(
        self, queries: torch.Tensor, own: torch.Tensor, width: int, *, nearest: torch.Tensor | None = None
    ) -> np.ndarray:
        """Each query's ``width`` most similar rows among its probed cells by float32 similarity, its
        ``own`` row (``-1``: none) left out: ``(A, width)`` int64, ``-1`` where there are fewer, in no
        particular order. ``nearest``: each query's :meth:`nearest_cell`, when already known."""
        queries = queries.detach().to(self.device, torch.float32)
        own = torch.as_tensor(own, dtype=torch.int64).to(self.device)
        if self.rows.shape[0] == 0 or queries.shape[0] == 0:
            return np.full((queries.shape[0], width), -1, dtype=np.int64)
        own_position = torch.where(own >= 0, self.position[own.clamp(min=0)], -1)
        nearest = self.nearest_cell(queries) if nearest is None else nearest.to(self.device)
        values, positions = self._scan(queries, nearest, width + 1)  # one more: the own row may be found
        values[positions == own_position[:, None]] = float("-inf")
        values, chosen = values.topk(min(width, values.shape[1]), dim=1, sorted=False)
        positions = positions.gather(1, chosen)
        columns = torch.where(torch.isfinite(values), self.ids[positions.clamp(min=0)], -1).cpu().numpy()
        if columns.shape[1] < width:
            columns = np.pad(columns, ((0, 0), (0, width - columns.shape[1])), constant_values=-1)
        return columns

    def nearest_cell(self, points: torch.Tensor) -> torch.Tensor:
        """Each point's nearest cell (in two levels from 1,024 cells on)."""
        return _nearest_centre(points, self.centres) if self.groups is None else self.groups.nearest(points)

    def cell_order(self, blocks: Iterable[torch.Tensor]) -> tuple[np.ndarray, torch.Tensor]:
        """The queries of ``blocks`` (in turn) sorted by their nearest cell, stable, and those cells: in
        this order a block of queries probes few cells, with many queries each (a matrix product and a
        top-k large enough for every thread)."""
        cells = torch.cat([self.nearest_cell(block.to(self.device)).cpu() for block in blocks])
        order = torch.argsort(cells, stable=True)
        return order.numpy(), cells[order]

    def probe(self, queries: torch.Tensor, probes: int, nearest: torch.Tensor | None = None) -> torch.Tensor:
        """The ``(A, probes)`` cells each query searches: its nearest (``nearest``, when known), then the
        nearest others of the cells around that one, nearest first."""
        nearest = self.nearest_cell(queries) if nearest is None else nearest
        if probes == 1:
            return nearest[:, None]
        out = torch.empty((queries.shape[0], probes), dtype=torch.int64, device=self.device)
        out[:, 0] = nearest
        order, runs = _runs(nearest, self.cells)
        for cell, low, high in runs:  # the queries of a cell share its candidates: one matrix product
            who, others = order[low:high], self.near[cell, 1:]
            scores = _distances(queries.index_select(0, who), self.centres[others], self.centre_norms[others])
            out[who, 1:] = others[scores.topk(probes - 1, dim=1, largest=False).indices]
        return out

    def _scan(
        self, queries: torch.Tensor, nearest: torch.Tensor, width: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Each query's ``width`` most similar stored positions in its probed cells (the first its
        ``nearest``): ``(values, positions)``, ``-inf`` and ``-1`` where there are fewer."""
        cells = self.probe(queries, self.probes, nearest)
        best = torch.full((queries.shape[0], width), float("-inf"), device=self.device)
        where = torch.full((queries.shape[0], width), -1, dtype=torch.int64, device=self.device)
        self._visit(queries, cells[:, :1], best, where, None)
        if cells.shape[1] > 1:
            self._visit(queries, cells[:, 1:], best, where, best.amin(dim=1))
        return best, where

    def _visit(
        self,
        queries: torch.Tensor,
        cells: torch.Tensor,
        best: torch.Tensor,
        where: torch.Tensor,
        floor: torch.Tensor | None,
    ) -> None:
        """Merge the rows of each query's ``cells`` into its running top-k ``best`` (values) and ``where``
        (positions), cell after cell; with a ``floor``, only the queries with a row above theirs. Without
        one, ``cells`` is one column: each query's first cell."""
        width = best.shape[1]
        order, runs = _runs(cells.flatten(), self.cells)
        for cell, low, high in runs:
            who, start, end = order[low:high] // cells.shape[1], self.starts[cell], self.ends[cell]
            if end == start:
                continue
            similarity = queries.index_select(0, who) @ self.rows[start:end].T
            if floor is None and end - start >= width:  # a query's first cell: nothing to merge with
                values, chosen = similarity.topk(width, dim=1, sorted=False)
                best.index_copy_(0, who, values)
                where.index_copy_(0, who, chosen + start)
                continue
            if floor is not None:
                above = torch.nonzero(similarity.amax(dim=1) > floor.index_select(0, who)).flatten()
                if above.numel() == 0:
                    continue
                who, similarity = who.index_select(0, above), similarity.index_select(0, above)
            merged = torch.cat([best.index_select(0, who), similarity], dim=1)
            values, chosen = merged.topk(width, dim=1, sorted=False)
            earlier = where.index_select(0, who).gather(1, chosen.clamp(max=width - 1))
            where.index_copy_(0, who, torch.where(chosen < width, earlier, chosen + (start - width)))
            best.index_copy_(0, who, values)
            if floor is not None:
                floor.index_copy_(0, who, values.amin(dim=1))

    def _calibrate(
        self, sample: tuple[torch.Tensor, torch.Tensor] | None, neighbours: int, recall: float
    ) -> int:
        """The fewest probes whose cells hold ``recall`` of the sample's nearest rows, on average."""
        most = min(MAX_PROBES, self.near.shape[1])
        if sample is None:  # a seeded sample of the rows themselves, each leaving itself out
            picked = torch.randperm(self.rows.shape[0], generator=torch.Generator().manual_seed(0))[:256]
            picked = picked.sort().values.to(self.device)
            sample = (self.rows[self.position[picked]], picked)
        queries = sample[0].detach().to(self.device, torch.float32)
        own = torch.as_tensor(sample[1], dtype=torch.int64).to(self.device)
        if queries.shape[0] == 0 or most == 1:
            return most
        truth, found = self._exact_positions(queries, own, min(neighbours, self.rows.shape[0]))
        keep = torch.nonzero(found.any(dim=1)).flatten()  # queries with a true neighbour
        truth_cells, found, queries = self.cell_of[truth[keep]], found[keep], queries[keep]
        rank = self._probe_rank(queries, truth_cells)
        counted = found.sum(dim=1).double()
        for probes in range(1, most + 1):
            if keep.numel() == 0 or float((((rank < probes) & found).sum(dim=1) / counted).mean()) >= recall:
                return probes
        return most

    def _probe_rank(self, queries: torch.Tensor, cells: torch.Tensor) -> torch.Tensor:
        """Where each of ``cells`` (``(S, k)``, per query) comes in the query's probe order, as
        :meth:`probe` ranks them: ``0`` its nearest cell, ``1 + i`` the ``i``-th nearest other, and
        :data:`_OTHER_CELLS` for a cell it never probes."""
        nearest = self.nearest_cell(queries)
        others = self.near[nearest, 1:]  # (S, M - 1)
        centres = self.centres[others]
        scores = self.centre_norms[others] - 2 * torch.einsum("sd,smd->sm", queries, centres)
        ranked = others.gather(1, scores.argsort(dim=1, stable=True))
        match = cells[:, :, None] == ranked[:, None, :]
        rank = torch.where(match.any(dim=2), 1 + match.int().argmax(dim=2), _OTHER_CELLS)
        return torch.where(cells == nearest[:, None], 0, rank)

    def _exact_positions(
        self, queries: torch.Tensor, own: torch.Tensor, width: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Each query's ``width`` most similar stored positions by brute force, its own row left out, and
        which of them exist: two ``(S, width)`` tensors."""
        own_position = torch.where(own >= 0, self.position[own.clamp(min=0)], -1)
        step = max(1, _SIMILARITY_BUDGET // max(1, self.rows.shape[0]))
        positions, found = [], []
        for start in range(0, queries.shape[0], step):
            similarity = queries[start : start + step] @ self.rows.T
            mine = own_position[start : start + step]
            has = torch.nonzero(mine >= 0).flatten()
            similarity[has, mine[has]] = float("-inf")
            values, top = similarity.topk(width, dim=1)
            positions.append(top)
            found.append(torch.isfinite(values))
        return torch.cat(positions), torch.cat(found)
