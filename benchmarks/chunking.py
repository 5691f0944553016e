"""The whole batch as the pool at a chunk's memory: what does ``forward_chunk_size`` cost and save?

One training step (forward, semi-hard mining over the whole batch, triplet loss, backward, SGD step) of
the glyphs recipe's ``Conv2dEncoder`` on B = 1024 images of 32 x 32, unchunked and with
``EmbeddingModel(forward_chunk_size=N)`` for several N. Step times are medians timed side by side in one
process (interleaved); peak memory is the growth of the peak resident set during one step, each in a
fresh process that first ran the same step at a tiny batch (so gradient buffers exist). The workers
run with ``MALLOC_MMAP_THRESHOLD_=65536``: every buffer above 64 KiB is mapped on allocation and
unmapped on free, so the peak tracks the tensors alive at once (what a GPU's
``max_memory_allocated`` reports) rather than which sizes glibc happened to keep cached from earlier
steps (with glibc's default, adaptive threshold, the same step measured 20 to 111 MiB at chunks of 128
depending only on the warm-up's batch size).
The goal (issue: "The whole device batch as the pool"): chunks of 128 at most a quarter of the
unchunked memory and at most 1.5x its time.

    python benchmarks/chunking.py [--quick] [--threads 2]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from _common import (
    label_axes,
    load_average,
    machine_info,
    markdown_table,
    peak_growth_bytes,
    run_worker,
    save_figure,
    time_interleaved,
    write_results,
)
from _common import parser as make_parser

from composer_dynsample import EmbeddingModel, TripletMarginLoss
from composer_dynsample.mining import SemiHardMiner
from composer_dynsample.models import Conv2dEncoder

GOAL_CHUNK = 128
WORKER_ENV = {"MALLOC_MMAP_THRESHOLD_": "65536"}


def make_step(batch: int, chunk: int | None):
    """A closure running one training step of ``batch`` random glyph-sized images."""
    torch.manual_seed(0)
    model = EmbeddingModel(Conv2dEncoder(), TripletMarginLoss(margin=0.2), forward_chunk_size=chunk)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    images = torch.rand(batch, 1, 32, 32)
    labels = torch.arange(batch) % max(batch // 4, 2)

    def step() -> None:
        embeddings = model.embed(images)
        loss = model.loss_fn(embeddings, labels, SemiHardMiner(margin=0.2)(embeddings.detach(), labels))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=False)

    return step


def peak_memory_worker(batch: int, chunk: int, threads: int) -> None:
    """In a fresh process: warm up at a tiny batch, then print the peak-RSS growth of one step as JSON."""
    torch.set_num_threads(threads)
    size = None if chunk >= batch else chunk
    make_step(16, None if size is None else min(size, 8))()
    step = make_step(batch, size)
    print(json.dumps({"peak_bytes": peak_growth_bytes(step)}))


def measure(batch: int, chunks: list[int], rounds: int, threads: int) -> list[dict]:
    """Median step time (interleaved) and peak memory (one fresh process each) per chunk size."""
    steps = {chunk: make_step(batch, None if chunk >= batch else chunk) for chunk in chunks}
    times = time_interleaved({str(chunk): fn for chunk, fn in steps.items()}, rounds)
    rows = []
    for chunk in chunks:
        peak = run_worker(Path(__file__), "--worker", batch, chunk, threads, env=WORKER_ENV)["peak_bytes"]
        rows.append({"batch": batch, "chunk": chunk, "step_s": times[str(chunk)], "peak_mib": peak / 2**20})
    full = next(row for row in rows if row["chunk"] >= batch)
    for row in rows:
        row["time_ratio"] = row["step_s"] / full["step_s"]
        row["memory_ratio"] = row["peak_mib"] / full["peak_mib"]
    return rows


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, ax = plt.subplots(figsize=(6, 4))
    chunks = [row["chunk"] for row in rows]
    ax.plot(chunks, [row["memory_ratio"] for row in rows], "o-", label="peak memory / unchunked")
    ax.plot(chunks, [row["time_ratio"] for row in rows], "s-", label="step time / unchunked")
    ax.axhline(0.25, color="grey", linestyle=":", label="memory goal (chunks of 128)")
    ax.axhline(1.5, color="grey", linestyle="--", label="time goal (chunks of 128)")
    ax.set_xscale("log", base=2)
    label_axes(ax, "forward_chunk_size", "ratio to the unchunked step", f"B = {rows[0]['batch']}", log=False)
    ax.legend(fontsize=8)
    save_figure(figure, path)


def table(rows: list[dict]) -> str:
    """The markdown table of step time and peak memory per chunk size."""
    batch = rows[-1]["batch"]
    return markdown_table(
        [
            "B",
            "forward_chunk_size",
            "step (s)",
            "peak memory growth (MiB)",
            "time / unchunked",
            "memory / unchunked",
        ],
        "rrrrrr",
        [
            [
                row["batch"],
                row["chunk"] if row["chunk"] < batch else "none",
                f"{row['step_s']:.3f}",
                f"{row['peak_mib']:.1f}",
                f"{row['time_ratio']:.2f}",
                f"{row['memory_ratio']:.3f}",
            ]
            for row in rows
        ],
    )


def main(argv: list[str] | None = None) -> dict:
    args = make_parser(__doc__, quick_help="B = 256, few rounds: a smoke test", threads=2).parse_args(argv)
    torch.set_num_threads(args.threads)
    batch = 256 if args.quick else 1024
    chunks = [32, 64, batch] if args.quick else [64, 128, 256, 512, batch]
    rows = measure(batch, chunks, 2 if args.quick else 7, args.threads)
    text = table(rows)
    goal = next((row for row in rows if row["chunk"] == GOAL_CHUNK), rows[0])
    met = goal["memory_ratio"] <= 0.25 and goal["time_ratio"] <= 1.5
    measured = (
        f"chunks of {goal['chunk']} at B = {batch}: {goal['memory_ratio']:.3f} of the unchunked peak memory "
        f"(goal <= 0.25) at {goal['time_ratio']:.2f}x its step time (goal <= 1.5x): "
        f"{'met' if met else 'NOT met'}; load average {load_average()}"
    )
    print(f"{text}\n\n{measured}")
    result = {
        "ratio": goal["memory_ratio"],
        "ratio_meaning": f"peak memory of a step with chunks of {goal['chunk']} / unchunked, B = {batch}",
        "rows": rows,
        "measured": measured,
        "met": met,
        "machine": machine_info(),
    }
    return write_results(
        args.out,
        "chunking",
        args.quick,
        result,
        text,
        notes=[f"measured: {measured}"],
        plot=lambda path: plot(rows, path),
    )


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        peak_memory_worker(*map(int, sys.argv[2:5]))
    else:
        main()
