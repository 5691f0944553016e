"""What does model-aware sampling beyond the batch cost on this CPU?

Side by side in one process (each hard-class plan in a fresh worker process, for its peak memory):

1. Writing the embedding table: one ``write_rows`` of a B = 256 batch into a 100,000-row table (float16,
   D = 64) against one training step of the small 1-D CNN of ``overhead.py`` at the same batch (goal:
   at most 2% of a step).
2. Building one epoch of hard-class P x K batches (32 x 4) from centroids, at growing sizes (goal:
   1,000,000 samples over 100,000 classes at D = 128 in under 10 s, memory linear in N), and how many of
   the exact 64 nearest classes the IVF search finds at 10,000 classes (recall@64).
3. The neighbour search of ``NeighbourBatchSampler`` at N x 128: exact chunked torch, faiss's exact flat
   index and faiss IVF, with the recall@8 of each against the exact lists.

    python benchmarks/table.py [--quick] [--threads 2]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import time
from pathlib import Path

import numpy as np
import torch
from _common import (
    LoadWatch,
    markdown_table,
    peak_growth_bytes,
    run_worker,
    time_interleaved,
    write_results,
)
from _common import parser as make_parser
from overhead import SmallCNN

from composer_dynsample import TripletMarginLoss
from composer_dynsample.algorithms.embedding_table import write_rows
from composer_dynsample.mining import SemiHardMiner
from composer_dynsample.samplers.hard_class import (
    EXACT_SEARCH_MAX_CLASSES,
    HardClassPKBatchSampler,
    nearest_classes,
)
from composer_dynsample.samplers.neighbours import nearest_other_class

HAS_FAISS = importlib.util.find_spec("faiss") is not None


def table_write_share(batch: int, rows: int, rounds: int) -> dict:
    """Median time of one table write and of one training step, and their ratio."""
    torch.manual_seed(0)
    model = SmallCNN()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    features, labels = torch.randn(batch, 40), torch.arange(batch) % (batch // 4)
    loss_fn = TripletMarginLoss(margin=0.2)
    table, written = torch.zeros(rows, 64, dtype=torch.float16), torch.full((rows,), -1)
    indices = torch.randperm(rows)[:batch]

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        embeddings = model(features)
        loss_fn(embeddings, labels, SemiHardMiner()(embeddings.detach(), labels)).backward()
        optimizer.step()

    with torch.no_grad():
        embeddings = model(features)
    medians = time_interleaved(
        {"write": lambda: write_rows(table, written, indices, embeddings, 1), "step": step}, rounds, warmup=2
    )
    return {
        "batch": batch,
        "rows": rows,
        "write_ms": round(medians["write"] * 1e3, 3),
        "step_ms": round(medians["step"] * 1e3, 2),
        "share": round(medians["write"] / medians["step"], 4),
    }


def hard_class_plan(samples: int, classes: int, dim: int) -> dict:
    """Seconds to hand over centroids (nearest classes) and to build one epoch of hard-class batches, and
    how far the two raise peak memory. Run in a fresh process (``--plan-worker``)."""
    rng = np.random.default_rng(0)
    labels = torch.from_numpy(rng.integers(0, classes, size=samples))
    sampler = HardClassPKBatchSampler(labels, 32, 4, small_classes="replace", seed=0)
    centroids = torch.randn(len(sampler.classes), dim, generator=torch.Generator().manual_seed(0))
    times: dict[str, float] = {}

    def build() -> np.ndarray:
        start = time.perf_counter()
        sampler.update_class_embeddings(centroids)
        sampler.set_epoch(1)
        times["snapshot_s"] = time.perf_counter() - start
        start = time.perf_counter()
        batches = sampler.global_batches(1)
        times["plan_s"] = time.perf_counter() - start
        return batches

    warm = HardClassPKBatchSampler(labels[:2000], 4, 2, small_classes="replace", seed=0)
    warm.update_class_embeddings(torch.randn(len(warm.classes), dim))
    warm.set_epoch(1)
    warm.global_batches(1)  # the code paths and allocator warmed, outside the measured peak
    peak = peak_growth_bytes(build)
    return {
        "samples": samples,
        "classes": classes,
        "dim": dim,
        "threads": torch.get_num_threads(),
        "search": "ivf" if len(sampler.classes) > EXACT_SEARCH_MAX_CLASSES else "exact",
        "batches": sampler.num_global_batches,
        "snapshot_s": round(times["snapshot_s"], 3),
        "plan_s": round(times["plan_s"], 3),
        "peak_mib": round(peak / 2**20, 1),
        "peak_bytes_per_sample": round(peak / samples, 1),
    }


def points(count: int, dim: int, groups: int, data: str, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``count`` points in ``groups`` and each one's group: the data each search is measured on.

    ``"iid"``: independent standard normal points, groups at random (the hardest case for any approximate
    search: in 128 dimensions every point is about as far from every other). ``"grouped"``: points around
    their group's standard normal centre, noise 0.5. ``"low-rank"``: the centres lie
    in a random 16-dimensional subspace (unit variance per coordinate), noise 0.125, closer to what trained
    embeddings look like.
    """
    generator = torch.Generator().manual_seed(seed)
    group = torch.randint(0, groups, (count,), generator=generator)
    if data == "iid":
        return torch.randn(count, dim, generator=generator), group
    if data == "grouped":
        centres, spread = torch.randn(groups, dim, generator=generator), 0.5
    else:
        basis = torch.randn(16, dim, generator=generator) / 4
        centres, spread = torch.randn(groups, 16, generator=generator) @ basis, 0.125
    return centres[group] + spread * torch.randn(count, dim, generator=generator), group


def recall(found: np.ndarray, exact: np.ndarray) -> float:
    """The mean share of each row's exact neighbours that ``found`` holds too (``-1`` padding ignored)."""
    hits = [len(set(a) & set(b) - {-1}) / max(1, len(set(b) - {-1})) for a, b in zip(found, exact)]
    return round(float(np.mean(hits)), 4)


def class_search(classes: int, dim: int, limit: int) -> list[dict]:
    """Exact against IVF nearest classes, on independent centroids and on centroids in groups of ten."""
    rows = []
    for data in ("iid", "grouped", "low-rank"):
        centroids = points(classes, dim, classes // 10, data, seed=0)[0]
        start = time.perf_counter()
        exact = nearest_classes(centroids, limit=limit, search="exact")
        exact_s = time.perf_counter() - start
        start = time.perf_counter()
        approximate = nearest_classes(centroids, limit=limit, search="ivf")
        ivf_s = time.perf_counter() - start
        exact64 = centroids.double()

        def mean_distance(lists: np.ndarray, exact64: torch.Tensor = exact64) -> float:
            return float((exact64[torch.from_numpy(lists)] - exact64[:, None]).norm(dim=2).mean())

        rows.append(
            {
                "classes": classes,
                "dim": dim,
                "limit": limit,
                "data": data,
                "exact_s": round(exact_s, 3),
                "ivf_s": round(ivf_s, 3),
                "recall": recall(approximate, exact),
                "recall_at_8": recall(approximate[:, :8], exact[:, :8]),
                "distance_ratio": round(mean_distance(approximate) / mean_distance(exact), 4),
            }
        )
    return rows


def neighbour_search(samples: int, dim: int, data: str) -> dict:
    """Seconds of each search for 8 nearest other-class samples, and each one's recall of the exact lists."""
    embeddings, labels = points(samples, dim, max(2, samples // 10), data, seed=0)
    row: dict = {"samples": samples, "dim": dim, "data": data}
    lists = {}
    for search in ("exact", "faiss", "faiss_ivf") if HAS_FAISS else ("exact",):
        start = time.perf_counter()
        lists[search], _ = nearest_other_class(embeddings, labels, 8, search=search)
        row[f"{search}_s"] = round(time.perf_counter() - start, 2)
        row[f"{search}_recall"] = recall(lists[search], lists["exact"])
    if HAS_FAISS:
        row["faiss_identical"] = bool(np.array_equal(lists["faiss"], lists["exact"]))
    return row


def tables(write: dict, plans: list[dict], classes: list[dict], searches: list[dict]) -> str:
    first = markdown_table(
        ["batch", "table rows", "write (ms)", "training step (ms)", "write / step"],
        "rrrrr",
        [
            [
                write["batch"],
                f"{write['rows']:,}",
                write["write_ms"],
                write["step_ms"],
                f"{100 * write['share']:.2f}%",
            ]
        ],
    )
    second = markdown_table(
        [
            "samples",
            "classes",
            "D",
            "torch threads",
            "batches",
            "nearest classes",
            "centroids -> nearest classes (s)",
            "one epoch's plan (s)",
            "total (s)",
            "peak memory (MiB)",
            "bytes / sample",
        ],
        "rrrrrlrrrrr",
        [
            [
                f"{p['samples']:,}",
                f"{p['classes']:,}",
                p["dim"],
                p["threads"],
                f"{p['batches']:,}",
                p["search"],
                p["snapshot_s"],
                p["plan_s"],
                round(p["snapshot_s"] + p["plan_s"], 2),
                p["peak_mib"],
                f"{p['peak_bytes_per_sample']:.0f}",
            ]
            for p in plans
        ],
    )
    third = markdown_table(
        [
            "classes",
            "D",
            "centroids",
            "exact top-64 (s)",
            "IVF top-64 (s)",
            "IVF recall@64",
            "IVF recall@8",
            "IVF / exact mean distance",
        ],
        "rrlrrrrr",
        [
            [
                f"{c['classes']:,}",
                c["dim"],
                c["data"],
                c["exact_s"],
                c["ivf_s"],
                c["recall"],
                c["recall_at_8"],
                c["distance_ratio"],
            ]
            for c in classes
        ],
    )
    fourth = markdown_table(
        [
            "samples",
            "D",
            "embeddings",
            "exact, chunked torch (s)",
            "faiss flat (s)",
            "faiss flat = exact",
            "faiss IVF (s)",
            "faiss IVF recall@8",
        ],
        "rrlrrlrr",
        [
            [
                f"{s['samples']:,}",
                s["dim"],
                s["data"],
                s["exact_s"],
                s.get("faiss_s", "-"),
                {True: "yes", False: "no"}.get(s.get("faiss_identical"), "-"),
                s.get("faiss_ivf_s", "-"),
                s.get("faiss_ivf_recall", "-"),
            ]
            for s in searches
        ],
    )
    return f"{first}\n\n{second}\n\n{third}\n\n{fourth}"


def summary(write: dict, plans: list[dict], searches: list[dict]) -> str:
    """One line of what was measured against each goal, met or not as measured."""
    largest_size = max((p["samples"], p["classes"]) for p in plans)
    at_size = [p for p in plans if (p["samples"], p["classes"]) == largest_size]
    at_goal_size = largest_size[0] >= 1_000_000 and largest_size[1] >= 100_000
    parts = []
    for plan in at_size:
        total = plan["snapshot_s"] + plan["plan_s"]
        verdict = ("met" if total < 10 else "missed") if at_goal_size else "not the goal's size"
        parts.append(f"{total:.1f} s with {plan['threads']} thread(s) ({verdict})")
    same = [p for p in plans if p["threads"] == at_size[-1]["threads"]]
    growth = ""
    if len(same) >= 2:
        growth = (
            f"; peak memory {same[-2]['peak_mib']:g} -> {same[-1]['peak_mib']:g} MiB "
            f"({same[-2]['peak_bytes_per_sample']:.0f} -> {same[-1]['peak_bytes_per_sample']:.0f} bytes per "
            f"sample) from {same[-2]['samples']:,} to {same[-1]['samples']:,} samples"
        )
    largest = searches[-1]
    faiss_part = ""
    if "faiss_s" in largest:
        faiss_part = (
            f", faiss flat {largest['faiss_s']} s, faiss IVF {largest['faiss_ivf_s']} s "
            f"(recall@8 {largest['faiss_ivf_recall']})"
        )
    return (
        f"table write {100 * write['share']:.2f}% of a step (goal <= 2%); hard-class plan at "
        f"{largest_size[0]:,} samples / {largest_size[1]:,} classes (goal: 1,000,000 / 100,000 under 10 s): "
        f"{', '.join(parts)}{growth}; neighbour search at {largest['samples']:,} x {largest['dim']}: exact "
        f"{largest['exact_s']} s{faiss_part}"
    )


def main(argv: list[str] | None = None) -> dict:
    parser = make_parser(__doc__, quick_help="small sizes: a smoke test", threads=2)
    parser.add_argument("--plan-worker", nargs=3, type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.plan_worker:  # a fresh process: one plan, its peak memory, printed as JSON
        print(json.dumps(hard_class_plan(*args.plan_worker)))
        return {}
    load = LoadWatch()
    write = table_write_share(256, 10_000 if args.quick else 100_000, 5 if args.quick else 30)
    plan_sizes = (
        [(10_000, 1_000)] if args.quick else [(10_000, 1_000), (100_000, 10_000), (1_000_000, 100_000)]
    )
    script = Path(__file__)
    # Both thread counts: on a shared 2-core machine a second torch thread can cost more than it gives.
    plans = [
        run_worker(script, "--plan-worker", n, c, 128, "--threads", threads)
        for threads in sorted({1, args.threads})
        for n, c in plan_sizes
    ]
    classes = class_search(2_000 if args.quick else 10_000, 128, 64)
    search_sizes = (
        [(5_000, "grouped")]
        if args.quick
        else [(20_000, "iid"), (20_000, "grouped"), (20_000, "low-rank"), (100_000, "low-rank")]
    )
    searches = [neighbour_search(n, 128, data) for n, data in search_sizes]
    text = tables(write, plans, classes, searches)
    measured = summary(write, plans, searches)
    loads = load.note()
    print(f"{text}\n\nmeasured: {measured}\n{loads}")
    result = {
        "ratio": write["share"],
        "ratio_meaning": "table write time / training step time at B = 256 (goal <= 0.02)",
        "write": write,
        "plans": plans,
        "class_search": classes,
        "searches": searches,
        "measured": measured,
        **load.fields(),
    }
    return write_results(args.out, "table", args.quick, result, text, notes=[f"measured: {measured}", loads])


if __name__ == "__main__":
    main()
