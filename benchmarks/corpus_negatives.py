"""What does one refresh of MinedNegativesPKBatchSampler cost: corpus negatives for 1,000,000 pairs?

One refresh is the search of every anchor's candidates in the embedding table's snapshot
(:func:`corpus_candidates`: rank window, duplicate, same-query and margin guards) followed by one
epoch's plan (``global_batches``). Goal: 1,000,000 pairs (2,000,000 rows, 1,000,000 anchors) at
D = 128 in under 30 s, memory linear in N. Measured here, each in a fresh worker process for its
peak memory, on one thread (this CPU is shared: ``OMP_NUM_THREADS=1``, ``torch.set_num_threads(1)``,
faiss's OpenMP threads 1):

1. The search at growing sizes, every anchor: exact chunked torch, faiss's exact flat index and faiss
   IVF, with the recall of IVF's examined lists against the exact ones.
2. At 1,000,000 pairs: the search's fixed cost (the passage matrix, the faiss index) and its cost per
   anchor, from a subset of anchors searched against the whole corpus, extrapolated to every anchor
   (an estimate: the exhaustive searches are quadratic and would take hours on one thread).
3. At 1,000,000 pairs: the sampler's construction and one epoch's plan (P = 64 pairs x (2 + 4)
   negatives), from candidate lists of the search's shape (random passages, 80% kept).

Embeddings: pairs around topics in a 16-dimensional subspace (low rank, as trained embeddings are), the
anchor and the positive of a pair close to each other; every text distinct.

    python benchmarks/corpus_negatives.py [--quick]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from _common import (
    load_average,
    machine_info,
    markdown_table,
    peak_growth_bytes,
    run_worker,
    write_results,
)
from _common import parser as make_parser

from composer_dynsample.samplers.mined_negatives import (
    CorpusCandidates,
    MinedNegativesPKBatchSampler,
    corpus_candidates,
)

HAS_FAISS = importlib.util.find_spec("faiss") is not None
DIM, SKIP_TOP, WINDOW, PAIRS_PER_BATCH, NEGATIVES = 128, 3, 16, 64, 4
GOAL_PAIRS, GOAL_S = 1_000_000, 30.0
ONE_THREAD = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}


def pair_embeddings(
    num_pairs: int, dim: int = DIM, seed: int = 0
) -> tuple[torch.Tensor, np.ndarray, np.ndarray]:
    """``(2 * num_pairs, dim)`` float32 rows (pair ``k``: rows ``2k``, its anchor, and ``2k + 1``), labels
    and the passage mask."""
    generator = torch.Generator().manual_seed(seed)
    topics = max(2, num_pairs // 100)
    basis = torch.randn(16, dim, generator=generator) / 4
    centres = torch.randn(topics, 16, generator=generator) @ basis
    topic = torch.randint(0, topics, (num_pairs,), generator=generator)
    rows = torch.empty(2 * num_pairs, dim)
    for start in range(0, num_pairs, 65536):  # in blocks: no temporary of the table's size
        end = min(start + 65536, num_pairs)
        pair = centres[topic[start:end]] + 0.25 * torch.randn(end - start, dim, generator=generator)
        block = pair.repeat_interleave(2, dim=0)
        rows[2 * start : 2 * end] = block + 0.1 * torch.randn(block.shape, generator=generator)
    labels = np.arange(2 * num_pairs) // 2
    return rows, labels, np.arange(2 * num_pairs) % 2 == 1


def set_one_thread() -> None:
    torch.set_num_threads(1)
    if HAS_FAISS:
        import faiss

        faiss.omp_set_num_threads(1)


def search_worker(num_pairs: int, search: str, anchors: int, out: str) -> dict:
    """One search (every anchor, or ``anchors`` of them against the whole corpus), its time and peak
    memory; the examined lists are saved to ``out`` when given."""
    embeddings, labels, is_passage = pair_embeddings(num_pairs)
    subset = None if anchors < 0 else np.linspace(0, num_pairs - 1, anchors).astype(np.int64)
    options = {"skip_top": SKIP_TOP, "max_relative_similarity": 0.95, "search": search}
    small, small_labels, small_passages = pair_embeddings(500)
    corpus_candidates(small, small_labels, small_passages, WINDOW, **options)  # warm the code path
    found: dict[str, CorpusCandidates] = {}
    seconds: dict[str, float] = {}

    def run() -> None:
        start = time.perf_counter()
        found["lists"] = corpus_candidates(embeddings, labels, is_passage, WINDOW, pairs=subset, **options)
        seconds["search"] = time.perf_counter() - start

    peak = peak_growth_bytes(run)
    result = {
        "pairs": num_pairs,
        "search": search,
        "anchors": num_pairs if subset is None else int(subset.size),
        "seconds": round(seconds["search"], 2),
        "peak_mib": round(peak / 2**20, 1),
        "peak_bytes_per_pair": round(peak / num_pairs, 1),
        "dropped": dict(
            zip(("rank_window", "duplicate", "same_query", "margin"), found["lists"].dropped.sum(0).tolist())
        ),
    }
    if subset is not None:  # the fixed cost: the same call without anchors
        start = time.perf_counter()
        corpus_candidates(embeddings, labels, is_passage, WINDOW, pairs=subset[:0], **options)
        result["fixed_seconds"] = round(time.perf_counter() - start, 2)
        per_anchor = max(seconds["search"] - result["fixed_seconds"], 0.0) / subset.size
        result["per_anchor_ms"] = round(per_anchor * 1e3, 3)
        result["estimated_all_anchors_s"] = round(result["fixed_seconds"] + per_anchor * num_pairs, 1)
    if out:
        np.save(out, found["lists"].ranked)
    return result


def plan_worker(num_pairs: int) -> dict:
    """The sampler's construction and one epoch's plan from candidate lists of the search's shape."""
    labels = np.arange(2 * num_pairs) // 2
    is_passage = np.arange(2 * num_pairs) % 2 == 1
    warm = MinedNegativesPKBatchSampler(labels[:2000], 8, 2, is_passage=is_passage[:2000])
    warm.global_batches(0)
    times: dict[str, float] = {}

    def build() -> np.ndarray:
        start = time.perf_counter()
        sampler = MinedNegativesPKBatchSampler(
            labels, PAIRS_PER_BATCH, NEGATIVES, is_passage=is_passage, skip_top=SKIP_TOP, window=WINDOW
        )
        times["construct_s"] = time.perf_counter() - start
        rng = np.random.default_rng(0)
        width = SKIP_TOP + WINDOW
        ranked = 2 * rng.integers(0, num_pairs, size=(num_pairs, width)) + 1
        kept = rng.random((num_pairs, width)) < 0.8
        kept[:, :SKIP_TOP] = False
        snapshot = CorpusCandidates(
            ranked, kept, np.zeros((num_pairs, 4), np.int64), np.ones(num_pairs, bool)
        )
        sampler.load_state_dict({"epoch": 1, "snapshot": snapshot._asdict(), "pending": None})
        start = time.perf_counter()
        batches = sampler.global_batches(1)
        times["plan_s"] = time.perf_counter() - start
        times["random_share"] = sampler.guard_counts(1)["random"] / batches[:, 2 * PAIRS_PER_BATCH :].size
        return batches

    peak = peak_growth_bytes(build)
    return {
        "pairs": num_pairs,
        "construct_s": round(times["construct_s"], 2),
        "plan_s": round(times["plan_s"], 2),
        "random_share": round(times["random_share"], 4),
        "peak_mib": round(peak / 2**20, 1),
        "peak_bytes_per_pair": round(peak / num_pairs, 1),
    }


def recall(found: np.ndarray, exact: np.ndarray) -> float:
    """The mean share of each anchor's exact examined passages (after the skipped ones) that ``found`` holds."""
    hits = [len(set(a) & set(b) - {-1}) / max(1, len(set(b) - {-1})) for a, b in zip(found, exact)]
    return round(float(np.mean(hits)), 4)


def scaling(sizes: list[int], folder: Path) -> list[dict]:
    """Every search at every size, all anchors, with faiss flat's equality to exact and IVF's recall."""
    script, rows = Path(__file__), []
    for pairs in sizes:
        lists = {}
        for search in ("exact", "faiss", "faiss_ivf") if HAS_FAISS else ("exact",):
            path = folder / f"{search}-{pairs}.npy"
            row = run_worker(
                script,
                "--search-worker",
                pairs,
                search,
                -1,
                path,
                "--threads",
                1,
                env=ONE_THREAD,
                timeout=3600,
            )
            lists[search] = np.load(path)
            if search != "exact":
                row["identical"] = bool(np.array_equal(lists[search], lists["exact"]))
                row["recall"] = recall(lists[search][:, SKIP_TOP:], lists["exact"][:, SKIP_TOP:])
            rows.append(row)
    return rows


def at_goal_size(pairs: int, anchors: int) -> tuple[list[dict], dict]:
    """The searches' fixed and per-anchor costs on the whole corpus, and the plan, at ``pairs``."""
    script = Path(__file__)
    searches = [
        run_worker(
            script,
            "--search-worker",
            pairs,
            search,
            anchors,
            "",
            "--threads",
            1,
            env=ONE_THREAD,
            timeout=3600,
        )
        for search in (("exact", "faiss", "faiss_ivf") if HAS_FAISS else ("exact",))
    ]
    plan = run_worker(script, "--plan-worker", pairs, "--threads", 1, env=ONE_THREAD, timeout=3600)
    return searches, plan


def tables(scaled: list[dict], estimates: list[dict], plan: dict) -> str:
    first = markdown_table(
        ["pairs", "search", "refresh (s)", "peak memory (MiB)", "bytes / pair", "= exact", "recall vs exact"],
        "rlrrrlr",
        [
            [
                f"{r['pairs']:,}",
                r["search"],
                r["seconds"],
                r["peak_mib"],
                f"{r['peak_bytes_per_pair']:.0f}",
                {True: "yes", False: "no"}.get(r.get("identical"), "-"),
                r.get("recall", "-"),
            ]
            for r in scaled
        ],
    )
    second = markdown_table(
        [
            "pairs",
            "search",
            "anchors searched",
            "fixed (s)",
            "per anchor (ms)",
            "all anchors, estimated (s)",
            "peak memory (MiB)",
        ],
        "rlrrrrr",
        [
            [
                f"{r['pairs']:,}",
                r["search"],
                f"{r['anchors']:,}",
                r["fixed_seconds"],
                r["per_anchor_ms"],
                f"{r['estimated_all_anchors_s']:,}",
                r["peak_mib"],
            ]
            for r in estimates
        ],
    )
    third = markdown_table(
        [
            "pairs",
            "P x (2 + negatives)",
            "construction (s)",
            "one epoch's plan (s)",
            "random negatives",
            "peak memory (MiB)",
            "bytes / pair",
        ],
        "rlrrrrr",
        [
            [
                f"{plan['pairs']:,}",
                f"{PAIRS_PER_BATCH} x (2 + {NEGATIVES})",
                plan["construct_s"],
                plan["plan_s"],
                f"{100 * plan['random_share']:.2f}%",
                plan["peak_mib"],
                f"{plan['peak_bytes_per_pair']:.0f}",
            ]
        ],
    )
    return f"{first}\n\n{second}\n\n{third}"


def summary(scaled: list[dict], estimates: list[dict], plan: dict) -> tuple[str, float]:
    """The measured line against the goal, and the best estimated refresh at the goal's size over 30 s."""
    best = min(estimates, key=lambda r: r["estimated_all_anchors_s"])
    total = best["estimated_all_anchors_s"] + plan["construct_s"] + plan["plan_s"]
    at_goal = plan["pairs"] >= GOAL_PAIRS
    verdict = ("met" if total < GOAL_S else "missed") if at_goal else "not the goal's size"
    searches = ", ".join(f"{r['search']} {r['estimated_all_anchors_s']:,} s" for r in estimates)
    same = [r for r in scaled if r["search"] == "exact"]
    growth = ""
    if len(same) >= 2:
        growth = (
            f"; exact search peak memory {same[0]['peak_bytes_per_pair']:.0f} -> "
            f"{same[-1]['peak_bytes_per_pair']:.0f} bytes per pair from {same[0]['pairs']:,} to "
            f"{same[-1]['pairs']:,} pairs"
        )
    line = (
        f"one refresh at {plan['pairs']:,} pairs x {DIM}, one thread: search (estimated from "
        f"{best['anchors']:,} anchors) {searches}; plan {plan['plan_s']} s (+ {plan['construct_s']} s to build "
        f"the sampler), peak {plan['peak_mib']:g} MiB; best total {total:,.0f} s against the goal of "
        f"{GOAL_S:g} s ({verdict}){growth}"
    )
    return line, total / GOAL_S


def main(argv: list[str] | None = None) -> dict:
    parser = make_parser(__doc__, quick_help="small sizes: a smoke test", threads=1)
    parser.add_argument("--search-worker", nargs=4, help=argparse.SUPPRESS)
    parser.add_argument("--plan-worker", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    set_one_thread()
    if args.search_worker:  # a fresh process: one search, its peak memory, printed as JSON
        pairs, search, anchors, out = args.search_worker
        print(json.dumps(search_worker(int(pairs), search, int(anchors), out)))
        return {}
    if args.plan_worker:
        print(json.dumps(plan_worker(args.plan_worker)))
        return {}
    load_before = load_average()
    with tempfile.TemporaryDirectory() as folder:
        scaled = scaling([2_000, 5_000] if args.quick else [10_000, 30_000, 100_000], Path(folder))
    estimates, plan = at_goal_size(20_000 if args.quick else GOAL_PAIRS, 200 if args.quick else 2_000)
    text = tables(scaled, estimates, plan)
    measured, ratio = summary(scaled, estimates, plan)
    loads = f"load average {load_before} before, {load_average()} after (other work on this machine slows every timing)"
    threads = "one thread throughout (OMP_NUM_THREADS=1, torch and faiss set to 1): the machine is shared"
    print(f"{text}\n\nmeasured: {measured}\n{threads}\n{loads}")
    result = {
        "ratio": round(ratio, 3),
        "ratio_meaning": "best estimated refresh (search + plan) at 1,000,000 pairs x 128 / 30 s (goal <= 1)",
        "settings": {
            "dim": DIM,
            "skip_top": SKIP_TOP,
            "window": WINDOW,
            "max_relative_similarity": 0.95,
            "pairs_per_batch": PAIRS_PER_BATCH,
            "negatives_per_anchor": NEGATIVES,
        },
        "scaling": scaled,
        "estimates": estimates,
        "plan": plan,
        "measured": measured,
        "threads": 1,
        "load_average": [load_before, load_average()],
        "machine": machine_info(),
    }
    notes = [f"measured: {measured}", threads, loads]
    return write_results(args.out, "corpus_negatives", args.quick, result, text, notes=notes)


if __name__ == "__main__":
    main()
