"""Time and peak memory to produce one epoch of P x K batches, 1,000,000 samples over 100,000 classes.

Goal: under 1 s on a 2-core CPU, memory linear in N. Peak memory is measured with ``tracemalloc``,
which sees numpy's allocations (the sampler is numpy end to end). Run:

    python benchmarks/samplers.py [--quick] [--out benchmarks/results]
"""

from __future__ import annotations

import statistics
import time
import tracemalloc

import numpy as np
from _common import machine_info, markdown_table, parser, write_results

from composer_dynsample import PKBatchSampler


def measure(num_samples: int, num_classes: int, p: int, k: int, world: int, repeats: int) -> dict:
    rng = np.random.default_rng(0)
    labels = rng.integers(0, num_classes, size=num_samples)
    start = time.perf_counter()
    sampler = PKBatchSampler(labels, p, k, num_replicas=world, rank=0, seed=0, small_classes="replace")
    build_s = time.perf_counter() - start

    times, list_times = [], []
    for epoch in range(repeats):
        sampler.set_epoch(epoch)
        start = time.perf_counter()
        batches = sampler.rank_batches()
        times.append(time.perf_counter() - start)
        # What a DataLoader consumes: the same epoch as Python lists of indices.
        start = time.perf_counter()
        as_lists = list(sampler)
        list_times.append(time.perf_counter() - start)
        if len(as_lists) != len(sampler):
            raise RuntimeError("len(sampler) disagrees with the batches produced")
    sampler.set_epoch(repeats)
    tracemalloc.start()
    batches = sampler.rank_batches()
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return {
        "num_samples": num_samples,
        "num_classes": num_classes,
        "classes_per_batch": p,
        "samples_per_class": k,
        "world_size": world,
        "batches_per_rank": int(batches.shape[0]),
        "construct_s": round(build_s, 4),
        "epoch_s_median": round(statistics.median(times), 4),
        "epoch_as_lists_s_median": round(statistics.median(list_times), 4),
        "epoch_peak_mib": round(peak / 2**20, 1),
        "peak_bytes_per_sample": round(peak / num_samples, 1),
    }


def main(argv: list[str] | None = None) -> dict:
    args = parser(__doc__, quick_help="small sizes only, for a smoke test").parse_args(argv)
    sizes = (
        [(10_000, 1_000), (100_000, 10_000)]
        if args.quick
        else [(100_000, 10_000), (300_000, 30_000), (1_000_000, 100_000)]
    )
    rows = [measure(n, c, p=32, k=4, world=1, repeats=3 if args.quick else 5) for n, c in sizes]
    headline = rows[-1]
    table = markdown_table(
        [
            "samples",
            "classes",
            "P x K",
            "batches",
            "construct (s)",
            "one epoch, array (s)",
            "one epoch, as lists (s)",
            "epoch peak (MiB)",
            "bytes/sample",
        ],
        "rrrrrrrrr",
        [
            [
                f"{r['num_samples']:,}",
                f"{r['num_classes']:,}",
                f"{r['classes_per_batch']} x {r['samples_per_class']}",
                f"{r['batches_per_rank']:,}",
                f"{r['construct_s']:.3f}",
                f"{r['epoch_s_median']:.3f}",
                f"{r['epoch_as_lists_s_median']:.3f}",
                f"{r['epoch_peak_mib']:.1f}",
                f"{r['peak_bytes_per_sample']:.0f}",
            ]
            for r in rows
        ],
    )
    goal = "one epoch of PK batches for 1,000,000 samples / 100,000 classes in under 1 s, memory linear in N"
    print(
        f"{table}\n\ngoal: {goal}\nmeasured: {headline['epoch_s_median']:.3f} s as an array, "
        f"{headline['epoch_as_lists_s_median']:.3f} s as lists, peak {headline['epoch_peak_mib']:.1f} MiB"
    )
    result = {
        "ratio": round(1.0 / headline["epoch_as_lists_s_median"], 3),
        "ratio_meaning": "goal time (1 s) / measured time of one epoch as lists at the largest size; >= 1 meets the goal",
        "goal": goal,
        "rows": rows,
        "machine": machine_info(torch_threads=False),
    }
    return write_results(args.out, "samplers", args.quick, result, table)


if __name__ == "__main__":
    main()
