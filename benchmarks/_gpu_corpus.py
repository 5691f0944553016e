"""The ``corpus_search`` check of ``benchmarks/gpu.py``: mined corpus negatives searched on the device.

At ``pairs`` pairs of clustered embeddings (``corpus_negatives.pair_embeddings``, D = 128), a sample of
``anchors`` anchors is searched exactly on the CPU and on the device (``corpus_candidates(...,
device=device)``, what ``MinedNegativesPKBatchSampler.search_device`` runs when the model is on CUDA), and
every anchor with the project's own IVF on the device (the sampler's refresh above 50,000 passages).
Passes when the device's exact lists equal the CPU's (the float64 ranking makes them a pure function of
the rows) and the IVF keeps at least 0.9 of the exact window over the sample. Reports the seconds of
each search (synchronised).

Only a sample is searched exactly, on either side. The exact search of every anchor is what the IVF
replaces at this size, and on CUDA it runs in blocks of ``2**25`` similarities (33 anchors at 1M
passages): 30,000 blocks, each waiting for the device and reranked on the host, the likely reason the
first H200 run (which searched every anchor exactly) did not finish this check at 1M pairs.
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


def check_corpus_search(device: torch.device, pairs: int, anchors: int) -> dict:
    """The exact search of ``anchors`` anchors on the CPU and on ``device``, and the IVF of all on ``device``."""
    embeddings, labels, is_passage = pair_embeddings(pairs)
    data = {"embeddings": embeddings, "labels": labels, "is_passage": is_passage, **OPTIONS}
    sample = np.unique(np.linspace(0, pairs - 1, min(anchors, pairs)).astype(np.int64))
    reference, cpu_s = _timed(torch.device("cpu"), search="exact", pairs=sample, **data)
    exact, exact_s = _timed(device, search="exact", pairs=sample, **data)
    ivf, ivf_s = _timed(device, search="ivf", **data)
    equal = bool(np.array_equal(exact.ranked, reference.ranked))
    recall = round(window_recall(ivf, reference, rows=sample), 4)
    rows = [
        {"search": "exact", "on": "cpu", "anchors": sample.size, "seconds": round(cpu_s, 2)},
        {"search": "exact", "on": device.type, "anchors": sample.size, "seconds": round(exact_s, 2),
         "equal_to_cpu": equal},
        {"search": "ivf", "on": device.type, "anchors": pairs, "seconds": round(ivf_s, 2), "window_recall": recall},
    ]  # fmt: skip
    return {
        "status": "ok" if equal and recall >= GOAL_RECALL else "failed",
        "summary": (
            f"{pairs:,} pairs: exact on {device.type}, {sample.size} anchors, {exact_s:.2f} s "
            f"({'equal to' if equal else 'DIFFERS from'} the CPU's lists, {cpu_s:.2f} s); ivf of every anchor "
            f"{ivf_s:.2f} s, window recall {recall}"
        ),
        "rows": rows,
    }
