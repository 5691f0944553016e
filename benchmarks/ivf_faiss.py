"""The project's own inverted file against faiss's IVF-Flat, at equal recall, on the corpus search of mined
negatives.

:class:`~composer_dynsample.samplers._ivf.InvertedFileIndex` (torch: k-means cells, a few probed per query)
searches every anchor's nearest passages when a mined-negatives refresh runs above 50,000 passages. faiss
(``IndexIVFFlat`` on inner products, the same number of cells) does the same job. Side by side, in one
process, on the same threads and the same rows (``corpus_negatives.py``'s pairs around topics, unit
length, ``--pairs`` anchors against as many passages):

- **the own index** as the sampler builds it: cells from :func:`ivf_cells`, its probes calibrated to its
  recall target; the seconds to build it and to search every anchor's ``K`` nearest passages;
- **faiss**: trained and filled with the same cells, then searched with the fewest ``nprobe`` (1, 2, 4, ...)
  whose recall on the sample is at least the own index's; its seconds to build and to search; once with
  faiss's k-means defaults (25 rounds on up to 256 points a cell) and once with the own index's budget (5
  rounds on 32 points a cell);
- **recall**: for a sample of 2,000 anchors, the share of their exact ``K`` nearest passages each search
  finds;
- **the same lists on 1 and 2 threads**: whether each search returns the same lists for the sample with one
  thread as with two (the sampler's batches must be the same on every rank, whatever its threads).

The headline ratio is faiss's seconds (build and search) over the own index's, at equal recall; below 1
faiss is faster.

    python benchmarks/ivf_faiss.py [--quick] [--pairs 1000000] [--threads 2]
"""

from __future__ import annotations

import json
import time

import numpy as np
import torch
from _common import machine_info, markdown_table, write_results
from _common import parser as make_parser
from corpus_negatives import pair_embeddings

from composer_dynsample.samplers._ivf import InvertedFileIndex, ivf_cells

K = 32  # the nearest passages each anchor's search returns (a window and its margin)
SAMPLE = 2_000  # anchors whose recall is measured against the exact search
NPROBES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
#: faiss's k-means trained as the own index trains its cells: 5 rounds on 32 points a cell.
OWN_KMEANS = {"niter": 5, "max_points_per_centroid": 32}


def unit_pairs(num_pairs: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(anchors, passages)``, each ``(num_pairs, 128)`` float32 of unit length."""
    rows, _, is_passage = pair_embeddings(num_pairs)
    rows = torch.nn.functional.normalize(rows, dim=1)
    mask = torch.from_numpy(is_passage)
    return rows[~mask].contiguous(), rows[mask].contiguous()


def exact_lists(queries: torch.Tensor, passages: torch.Tensor) -> np.ndarray:
    """Each query's ``K`` most similar passages, exactly (in blocks)."""
    found = [(block @ passages.T).topk(K, dim=1).indices for block in queries.split(256)]
    return torch.cat(found).numpy()


def recall(found: np.ndarray, exact: np.ndarray) -> float:
    """The mean share of each row's exact list that ``found`` holds."""
    return float(np.mean([len(set(a.tolist()) & set(b.tolist())) / K for a, b in zip(found, exact)]))


def same_sets(first: np.ndarray, second: np.ndarray) -> bool:
    return all(set(a.tolist()) == set(b.tolist()) for a, b in zip(first, second))


def own_index(anchors: torch.Tensor, passages: torch.Tensor, sample: np.ndarray, threads: int) -> dict:
    none = torch.full((anchors.shape[0],), -1, dtype=torch.int64)
    start = time.perf_counter()
    index = InvertedFileIndex(passages)
    build = time.perf_counter() - start
    start = time.perf_counter()
    found = index(anchors, none, K)
    search = time.perf_counter() - start
    torch.set_num_threads(1)
    one_thread = index(anchors[sample], none[sample], K)
    torch.set_num_threads(threads)
    return {"cells": index.cells, "probes": index.probes, "build_s": build, "search_s": search,
            "found": found, "one_thread": one_thread}  # fmt: skip


def faiss_index(anchors: torch.Tensor, passages: torch.Tensor, cells: int, sample: np.ndarray,
                exact: np.ndarray, target: float, threads: int, training: dict | None = None) -> dict:  # fmt: skip
    """faiss's IVF-Flat searched at the fewest ``nprobe`` reaching ``target``; ``training`` sets its k-means
    (``niter``, ``max_points_per_centroid``), else faiss's defaults (25 rounds, up to 256 points a cell)."""
    import faiss

    database, queries = passages.numpy(), anchors.numpy()
    start = time.perf_counter()
    quantizer = faiss.IndexFlatIP(database.shape[1])
    index = faiss.IndexIVFFlat(quantizer, database.shape[1], cells, faiss.METRIC_INNER_PRODUCT)
    for key, value in (training or {}).items():
        setattr(index.cp, key, value)
    index.train(database)
    index.add(database)
    build = time.perf_counter() - start
    tried = {}
    for nprobe in NPROBES:
        index.nprobe = min(nprobe, cells)
        tried[nprobe] = recall(index.search(queries[sample], K)[1], exact)
        if tried[nprobe] >= target or nprobe >= cells:
            break
    start = time.perf_counter()
    found = index.search(queries, K)[1]
    search = time.perf_counter() - start
    faiss.omp_set_num_threads(1)
    one_thread = index.search(queries[sample], K)[1]
    faiss.omp_set_num_threads(threads)
    return {"nprobe": index.nprobe, "recall_by_nprobe": tried, "build_s": build, "search_s": search,
            "found": found, "one_thread": one_thread}  # fmt: skip


def main(argv: list[str] | None = None) -> dict:
    parser = make_parser(__doc__, quick_help="10,000 pairs, for the tests", threads=2)
    parser.add_argument("--pairs", type=int, default=None, help="anchors and passages (default 1,000,000)")
    args = parser.parse_args(argv)
    import faiss

    num_pairs = args.pairs or (10_000 if args.quick else 1_000_000)
    torch.set_num_threads(args.threads)
    faiss.omp_set_num_threads(args.threads)
    anchors, passages = unit_pairs(num_pairs)
    sample = np.random.default_rng(0).choice(num_pairs, size=min(SAMPLE, num_pairs), replace=False)
    exact = exact_lists(anchors[sample], passages)
    own = own_index(anchors, passages, sample, args.threads)
    own_recall = recall(own["found"][sample], exact)
    theirs = faiss_index(anchors, passages, own["cells"], sample, exact, own_recall, args.threads)
    as_own = faiss_index(anchors, passages, own["cells"], sample, exact, own_recall, args.threads, OWN_KMEANS)
    rows = []
    named = (
        ("own IVF (torch)", own),
        ("faiss IVF-Flat", theirs),
        ("faiss IVF-Flat, k-means as the own", as_own),
    )
    for name, result in named:
        rows.append({
            "index": name, "cells": own["cells"],
            "probes": result.get("probes", result.get("nprobe")),
            "recall": round(recall(result["found"][sample], exact), 4),
            "build_s": round(result["build_s"], 2), "search_s": round(result["search_s"], 2),
            "total_s": round(result["build_s"] + result["search_s"], 2),
            "same_lists_1_and_2_threads": same_sets(result["found"][sample], result["one_thread"]),
        })  # fmt: skip
    ratio = rows[1]["total_s"] / rows[0]["total_s"]
    result = {
        "pairs": num_pairs, "k": K, "threads": args.threads, "cells_default": ivf_cells(num_pairs),
        "rows": rows, "faiss_recall_by_nprobe": theirs["recall_by_nprobe"], "ratio": round(ratio, 3),
        "ratio_own_kmeans": round(rows[2]["total_s"] / rows[0]["total_s"], 3),
        "faiss_version": faiss.__version__, "machine": machine_info(),
    }  # fmt: skip
    headers = [
        "index",
        "cells",
        "probes",
        "recall",
        "build_s",
        "search_s",
        "total_s",
        "same_lists_1_and_2_threads",
    ]
    table = markdown_table(headers, "lrrrrrrl", [[row[key] for key in headers] for row in rows])
    heading = (
        f"{num_pairs:,} anchors against {num_pairs:,} passages x 128, the {K} nearest each, {args.threads} "
        f"threads; recall on {len(sample):,} anchors against the exact search; faiss {faiss.__version__} at the "
        "fewest nprobe reaching the own index's recall."
    )
    note = (
        f"- faiss / own, build and search at equal recall: {ratio:.2f}x the time with faiss's k-means defaults, "
        f"{result['ratio_own_kmeans']:.2f}x with the own index's k-means budget."
    )
    write_results(args.out, "ivf_faiss", args.quick, result, f"{heading}\n\n{table}", notes=[note])
    print(f"{heading}\n\n{table}\n\n{note}")
    print(json.dumps({key: result[key] for key in ("ratio", "faiss_recall_by_nprobe")}))
    return result


if __name__ == "__main__":
    main()
