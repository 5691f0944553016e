"""The ``corpus_search`` check of ``benchmarks/gpu.py``: mined corpus negatives searched on the device.

At ``pairs`` pairs of clustered embeddings (``corpus_negatives.pair_embeddings``, D = 128), every anchor's
candidates are searched on the device (``corpus_candidates(..., device=device)``, what
``MinedNegativesPKBatchSampler.search_device`` runs when the model is on CUDA) exactly and with the
project's own IVF, and a sample of anchors on the CPU exactly. Passes when the device's exact lists equal
the CPU's for the sample (the float64 ranking makes them a pure function of the rows) and the IVF keeps at
least 0.9 of the exact window. Reports the seconds of each search (synchronised).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch
from _cuda import synchronize
from corpus_negatives import OPTIONS, pair_embeddings

from composer_dynsample.samplers._candidates import window_recall
from composer_dynsample.samplers.mined_negatives import corpus_candidates

GOAL_RECALL = 0.9


def _timed(device: torch.device, **options: Any) -> tuple[Any, float]:
    synchronize(device)
    start = time.perf_counter()
    found = corpus_candidates(**options, device=device)
    synchronize(device)
    return found, time.perf_counter() - start


def check_corpus_search(device: torch.device, pairs: int, anchors: int = 2_000) -> dict:
    """The exact and the IVF search of ``pairs`` pairs on ``device`` against the CPU's exact search."""
    embeddings, labels, is_passage = pair_embeddings(pairs)
    data = {"embeddings": embeddings, "labels": labels, "is_passage": is_passage, **OPTIONS}
    sample = np.unique(np.linspace(0, pairs - 1, min(anchors, pairs)).astype(np.int64))
    reference, cpu_s = _timed(torch.device("cpu"), search="exact", pairs=sample, **data)
    rows, equal = [], True
    for search in ("exact", "ivf"):
        found, seconds = _timed(device, search=search, **data)
        recall = window_recall(found, reference, rows=sample)
        same = bool(np.array_equal(found.ranked[sample], reference.ranked))
        equal &= same or search != "exact"
        rows.append({"search": search, "pairs": pairs, "seconds": round(seconds, 2), "window_recall": round(recall, 4),
                     "equal_to_cpu": same})  # fmt: skip
    rows.append(
        {"search": f"exact on the CPU, {sample.size} anchors", "pairs": pairs, "seconds": round(cpu_s, 2)}
    )
    ivf = rows[1]
    passed = equal and ivf["window_recall"] >= GOAL_RECALL
    return {
        "status": "passed" if passed else "failed",
        "summary": (
            f"{pairs:,} pairs: exact {rows[0]['seconds']} s ({'equal to' if equal else 'DIFFERS from'} the CPU's lists), "
            f"ivf {ivf['seconds']} s, window recall {ivf['window_recall']}"
        ),
        "rows": rows,
    }
