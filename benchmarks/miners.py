"""Time the miners against pytorch-metric-learning's and against one ``emb @ emb.T`` matmul.

For B = 256 and 1024 L2-normalised random embeddings (D = 128, P x K labels with 8 samples per class),
each miner, its PML counterpart and one B x D x B matmul are timed in the same process, with
``torch.set_num_threads`` fixed, interleaved round by round (so that load from other processes hits all
of them alike), and reported as the median of the rounds after warm-up. Triplets / pairs are compared
with PML's where the semantics match (batch_hard, multi_similarity).

Peak memory of semi_hard vs PML's ``TripletMarginMiner(type_of_triplets="semihard")``, and of
multi_similarity (beside the size of the pairs it returns, which on random embeddings are nearly all of
B x B, 16 bytes each), is the growth of
the peak resident set size of a fresh subprocess during a single call (after a tiny warm-up call, the
kernel's high-water mark ``VmHWM`` is reset through ``/proc/self/clear_refs`` and compared with
``VmRSS`` before the call). torch's CPU allocations are invisible to ``tracemalloc``, but every page a
call touches (the distance matrix, its temporaries, PML's B^3 triplet mask and index lists) shows up in
the RSS; a fresh process keeps earlier freed memory from being reused unseen. Where ``/proc`` is missing
the ``ru_maxrss`` growth is used instead (a lower bound).

Goals (checked and printed next to the measured figures):

* batch_hard: at most 3x the matmul, at least 3x faster than PML's BatchHardMiner, identical triplets;
* semi_hard: at most 4x the matmul, O(B^2) memory;
* multi_similarity: faster than PML's MultiSimilarityMiner, identical pairs, peak memory at most 3x the
  B x B float32 matrix (reported with and without the returned pairs).

Run:

    python benchmarks/miners.py [--quick] [--out benchmarks/results] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections.abc import Callable

import torch
import torch.nn.functional as F
from _common import (
    goal_table,
    load_average,
    machine_info,
    markdown_table,
    peak_growth_bytes,
    time_interleaved,
    write_results,
)
from _common import parser as make_parser
from pytorch_metric_learning import __version__ as pml_version
from pytorch_metric_learning import distances as pml_distances
from pytorch_metric_learning import miners as pml_miners

from composer_dynsample.mining import (
    BatchHardMiner,
    DistanceWeightedMiner,
    HardTopKMiner,
    MultiSimilarityMiner,
    SemiHardMiner,
)

DIM = 128
PER_CLASS = 8
MARGIN = 0.2
EPSILON = 0.1


def make_batch(batch: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    emb = F.normalize(torch.randn(batch, DIM, generator=gen), dim=1)
    labels = torch.arange(batch // PER_CLASS).repeat_interleave(PER_CLASS)
    return emb, labels


def cases(emb: torch.Tensor, labels: torch.Tensor) -> list[dict]:
    """Each row: our miner, its PML counterpart (or None) and whether the outputs must be identical."""
    gen = torch.Generator()
    return [
        {
            "miner": "batch_hard",
            "distance": "cosine",
            "ours": lambda: BatchHardMiner()(emb, labels),
            "pml_name": "BatchHardMiner(CosineSimilarity())",
            "pml": pml_miners.BatchHardMiner(distance=pml_distances.CosineSimilarity()),
            "compare": "triplets",
        },
        {
            "miner": "batch_hard",
            "distance": "euclidean",
            "ours": lambda: BatchHardMiner(distance="euclidean")(emb, labels),
            "pml_name": "BatchHardMiner()",
            "pml": pml_miners.BatchHardMiner(),
            "compare": "triplets",
        },
        {
            "miner": "semi_hard",
            "distance": "cosine",
            "ours": lambda: SemiHardMiner(margin=MARGIN)(emb, labels),
            "pml_name": "TripletMarginMiner(semihard) [all triplets]",
            "pml": pml_miners.TripletMarginMiner(
                margin=MARGIN, type_of_triplets="semihard", distance=pml_distances.CosineSimilarity()
            ),
            "compare": None,
        },
        {
            "miner": "hard_topk(k=3)",
            "distance": "cosine",
            "ours": lambda: HardTopKMiner(k=3)(emb, labels),
            "pml_name": None,
            "pml": None,
            "compare": None,
        },
        {
            "miner": "multi_similarity",
            "distance": "cosine",
            "ours": lambda: MultiSimilarityMiner(epsilon=EPSILON)(emb, labels),
            "pml_name": "MultiSimilarityMiner(0.1)",
            "pml": pml_miners.MultiSimilarityMiner(epsilon=EPSILON),
            "compare": "pairs",
        },
        {
            "miner": "distance_weighted",
            "distance": "euclidean",
            "ours": lambda: DistanceWeightedMiner(generator=gen.manual_seed(0))(emb, labels),
            "pml_name": "DistanceWeightedMiner() [other sampling]",
            "pml": pml_miners.DistanceWeightedMiner(),
            "compare": None,
        },
    ]


def identical(ours: tuple[torch.Tensor, ...], theirs: tuple[torch.Tensor, ...], kind: str, size: int) -> bool:
    """Same index tuples as sets (PML orders them differently), compared as sorted encoded integers."""

    def encoded(*columns: torch.Tensor) -> torch.Tensor:
        code = torch.zeros_like(columns[0])
        for column in columns:
            code = code * size + column
        return code.sort().values

    def same(a: tuple[torch.Tensor, ...], b: tuple[torch.Tensor, ...]) -> bool:
        return torch.equal(encoded(*a), encoded(*b))

    if kind == "triplets":
        return same(ours, theirs)
    return same(ours[:2], theirs[:2]) and same(ours[2:], theirs[2:])


def measure(batch: int, rounds: int, quick: bool) -> list[dict]:
    emb, labels = make_batch(batch)
    rows = cases(emb, labels)
    fns: dict[str, Callable[[], object]] = {"matmul": lambda: emb @ emb.T}
    slow: dict[str, Callable[[], object]] = {}
    for i, row in enumerate(rows):
        fns[f"ours{i}"] = row["ours"]
        if row["pml"] is None:
            continue
        call = (lambda m: lambda: m(emb, labels))(row["pml"])
        # At B = 1024 PML's semihard enumerates all B^3 candidate triplets (seconds, ~2 GB) and its
        # DistanceWeightedMiner loops over labels (seconds): timed apart with 3 rounds, skipped if quick.
        if batch >= 1024 and row["miner"] in ("semi_hard", "distance_weighted"):
            if not quick:
                slow[f"pml{i}"] = call
        else:
            fns[f"pml{i}"] = call
    medians = time_interleaved(fns, rounds, warmup=1 if quick else 2)
    if slow:
        medians.update(time_interleaved(slow, rounds=3, warmup=1))
    results = []
    for i, row in enumerate(rows):
        ours_s, pml_s = medians[f"ours{i}"], medians.get(f"pml{i}")
        same = None
        if row["compare"] is not None:
            same = identical(row["ours"](), row["pml"](emb, labels), row["compare"], batch)
        results.append(
            {
                "batch": batch,
                "miner": row["miner"],
                "distance": row["distance"],
                "pml": row["pml_name"],
                "ours_ms": round(ours_s * 1e3, 3),
                "pml_ms": None if pml_s is None else round(pml_s * 1e3, 3),
                "matmul_ms": round(medians["matmul"] * 1e3, 3),
                "ours_over_matmul": round(ours_s / medians["matmul"], 2),
                "pml_over_ours": None if pml_s is None else round(pml_s / ours_s, 2),
                "identical": same,
            }
        )
    return results


def memory_worker(which: str, batch: int, threads: int) -> None:
    """Runs in a fresh subprocess: print the peak-RSS growth (bytes) of one call and its output's size."""
    torch.set_num_threads(threads)
    pml = pml_miners.TripletMarginMiner(
        margin=MARGIN, type_of_triplets="semihard", distance=pml_distances.CosineSimilarity()
    )
    miners = {
        "ours": lambda e, lab: SemiHardMiner(margin=MARGIN)(e, lab),
        "pml": pml,
        "multi_similarity": lambda e, lab: MultiSimilarityMiner(epsilon=EPSILON)(e, lab),
    }
    call = miners[which]
    call(*make_batch(16, seed=1))  # load code paths and library buffers before the baseline
    emb, labels = make_batch(batch)
    outputs: list[tuple[torch.Tensor, ...]] = []
    growth = peak_growth_bytes(lambda: outputs.append(call(emb, labels)))
    # The returned index tensors, counted once per storage (pairs may be views of one (n, 2) tensor).
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in outputs[0]}
    print(json.dumps({"peak_growth_bytes": growth, "output_bytes": sum(storages.values())}))


def peak_memory(jobs: list[tuple[str, int]], threads: int) -> dict[tuple[str, int], tuple[float, float]]:
    """Peak-RSS growth and output size in MiB of one call per job, each job in its own fresh process
    (run concurrently)."""
    procs = {
        job: subprocess.Popen(
            [sys.executable, __file__, "--memory-worker", job[0], str(job[1]), "--threads", str(threads)],
            stdout=subprocess.PIPE,
            text=True,
        )
        for job in jobs
    }
    results = {}
    for job, proc in procs.items():
        out, _ = proc.communicate()
        if proc.returncode != 0:
            raise RuntimeError(f"memory worker {job} failed with exit code {proc.returncode}")
        report = json.loads(out.strip().splitlines()[-1])
        results[job] = (report["peak_growth_bytes"] / 2**20, report["output_bytes"] / 2**20)
    return results


def fmt(x: float | None, spec: str = ".2f") -> str:
    return "n/a" if x is None else format(x, spec)


def memory_rows(peaks: dict[tuple[str, int], tuple[float, float]]) -> list[dict]:
    """Peak-RSS growth of semi_hard, PML's semihard and multi_similarity per B, beside B^2 float32."""
    return [
        {
            "batch": batch,
            "semi_hard_peak_mib": round(peaks[("ours", batch)][0], 1),
            "pml_semihard_peak_mib": round(peaks[("pml", batch)][0], 1) if ("pml", batch) in peaks else None,
            "multi_similarity_peak_mib": round(peaks[("multi_similarity", batch)][0], 1),
            "multi_similarity_output_mib": round(peaks[("multi_similarity", batch)][1], 1),
            "b2_float32_mib": round(batch * batch * 4 / 2**20, 1),
        }
        for batch in (256, 1024)
    ]


def _identical_goal(rows: list[dict], miner: str, what: str) -> dict:
    same = [r["identical"] for r in rows if r["miner"] == miner]
    return {
        "goal": f"{miner} {what} identical to PML's (B=256, 1024)",
        "measured": ", ".join("yes" if s else "no" for s in same),
        "met": all(same),
    }


def goal_rows(rows: list[dict], memory: list[dict]) -> list[dict]:
    """The goals of the module docstring, each with its measured figure and whether it is met."""

    def row(miner: str) -> dict:
        return next(
            r for r in rows if r["miner"] == miner and r["batch"] == 1024 and r["distance"] == "cosine"
        )

    bh, sh, ms = row("batch_hard"), row("semi_hard"), row("multi_similarity")
    mem_256, mem_1024 = memory
    # O(B^2): the peak per (anchor, pool entry) must not grow with B; PML's semihard grows like B.
    per_entry = {m["batch"]: m["semi_hard_peak_mib"] * 2**20 / m["batch"] ** 2 for m in memory}
    pml_peak = (
        f"; PML semihard {mem_1024['pml_semihard_peak_mib']:.0f} MiB"
        if mem_1024["pml_semihard_peak_mib"] is not None
        else f"; PML semihard {mem_256['pml_semihard_peak_mib']:.0f} MiB at B=256"
    )
    return [
        {
            "goal": "batch_hard <= 3x matmul (B=1024)",
            "measured": f"{bh['ours_over_matmul']:.2f}x",
            "met": bh["ours_over_matmul"] <= 3.0,
        },
        {
            "goal": "batch_hard >= 3x faster than PML BatchHardMiner (B=1024)",
            "measured": f"{bh['pml_over_ours']:.2f}x",
            "met": bh["pml_over_ours"] >= 3.0,
        },
        _identical_goal(rows, "batch_hard", "triplets"),
        {
            "goal": "semi_hard <= 4x matmul (B=1024)",
            "measured": f"{sh['ours_over_matmul']:.2f}x",
            "met": sh["ours_over_matmul"] <= 4.0,
        },
        {
            "goal": "semi_hard memory O(B^2)",
            "measured": f"peak {mem_1024['semi_hard_peak_mib']:.1f} MiB at B=1024 = {per_entry[1024]:.0f} bytes per"
            f" anchor-pool entry ({per_entry[256]:.0f} at B=256)" + pml_peak,
            # Flat bytes per entry from B=256 to 1024 (quadratic total), with a working set of a few
            # distance-matrix copies (under 64 bytes per entry).
            "met": per_entry[1024] <= 64 and per_entry[1024] <= 1.5 * max(per_entry[256], 1.0),
        },
        {
            "goal": "multi_similarity faster than PML MultiSimilarityMiner (B=1024)",
            "measured": f"{ms['pml_over_ours']:.2f}x",
            "met": ms["pml_over_ours"] > 1.0,
        },
        _identical_goal(rows, "multi_similarity", "pairs"),
        *_multi_similarity_memory_goals(mem_1024),
    ]


def _multi_similarity_memory_goals(mem: dict) -> list[dict]:
    """Peak memory of multi_similarity at B=1024 in units of the B x B float32 matrix, with and without
    the pairs it returns (on random embeddings nearly every negative pair is kept: 16 bytes each, about
    4x that matrix, more than the goal by themselves)."""
    unit = mem["b2_float32_mib"]
    peak, output = mem["multi_similarity_peak_mib"], mem["multi_similarity_output_mib"]
    beyond = max(peak - output, 0.0)
    return [
        {
            "goal": "multi_similarity peak memory <= 3x B x B float32 (B=1024)",
            "measured": f"peak {peak:.1f} MiB = {peak / unit:.2f}x, of which the returned pairs "
            f"{output:.1f} MiB = {output / unit:.2f}x",
            "met": peak <= 3.0 * unit,
        },
        {
            "goal": "multi_similarity peak memory beyond its returned pairs <= 3x B x B float32 (B=1024)",
            "measured": f"{beyond:.1f} MiB = {beyond / unit:.2f}x",
            "met": beyond <= 3.0 * unit,
        },
    ]


def tables(rows: list[dict], memory: list[dict], goals: list[dict]) -> str:
    """The timing, memory and goal tables of ``miners.md``."""
    timing = markdown_table(
        [
            "B",
            "miner",
            "distance",
            "PML counterpart",
            "ours (ms)",
            "PML (ms)",
            "matmul (ms)",
            "ours / matmul",
            "PML / ours",
            "identical",
        ],
        "rlllrrrrrl",
        [
            [
                r["batch"],
                r["miner"],
                r["distance"],
                r["pml"] or "-",
                fmt(r["ours_ms"]),
                fmt(r["pml_ms"]),
                fmt(r["matmul_ms"], ".3f"),
                fmt(r["ours_over_matmul"]),
                fmt(r["pml_over_ours"]),
                "n/a" if r["identical"] is None else ("yes" if r["identical"] else "no"),
            ]
            for r in rows
        ],
    )
    peaks = markdown_table(
        [
            "B",
            "semi_hard peak RSS growth (MiB)",
            "PML semihard peak RSS growth (MiB)",
            "multi_similarity peak RSS growth (MiB)",
            "multi_similarity returned pairs (MiB)",
            "B^2 float32 (MiB)",
        ],
        "rrrrrr",
        [
            [
                m["batch"],
                f"{m['semi_hard_peak_mib']:.1f}",
                fmt(m["pml_semihard_peak_mib"], ".1f"),
                f"{m['multi_similarity_peak_mib']:.1f}",
                f"{m['multi_similarity_output_mib']:.1f}",
                f"{m['b2_float32_mib']:.1f}",
            ]
            for m in memory
        ],
    )
    met = goal_table(goals)
    return "\n\n".join([timing, peaks, met])


def run_config(args: argparse.Namespace, rounds: int, load_before: tuple[float, ...] | None) -> dict:
    """What the run was: threads, sizes, rounds, versions, machine and the load around it."""
    return {
        "threads": args.threads,
        "dim": DIM,
        "samples_per_class": PER_CLASS,
        "rounds": rounds,
        "quick": args.quick,
        "torch": torch.__version__,
        "pytorch_metric_learning": pml_version,
        "machine": machine_info(),
        "cpus": os.cpu_count(),
        "load_average_1_5_15min_before": load_before,
        "load_average_1_5_15min_after": load_average(),
    }


def main() -> None:
    parser = make_parser(
        __doc__, quick_help="3 rounds; no PML semihard / DistanceWeightedMiner at B = 1024", threads=2
    )
    parser.add_argument("--rounds", type=int, default=None, help="timed rounds (default 3 quick, 21 full)")
    parser.add_argument("--memory-worker", nargs=2, metavar=("WHICH", "B"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.memory_worker:
        memory_worker(args.memory_worker[0], int(args.memory_worker[1]), args.threads)
        return

    torch.set_num_threads(args.threads)
    # Other processes on the machine distort timings (with several threads, every parallel region waits
    # for a descheduled thread): the load average is recorded with the results.
    load_before = load_average()
    rounds = args.rounds or (3 if args.quick else 21)
    rows = [row for batch in (256, 1024) for row in measure(batch, rounds, quick=args.quick)]
    jobs = [("ours", 256), ("pml", 256), ("ours", 1024)] + ([] if args.quick else [("pml", 1024)])
    jobs += [("multi_similarity", 256), ("multi_similarity", 1024)]
    memory = memory_rows(peak_memory(jobs, args.threads))
    goals = goal_rows(rows, memory)
    table = tables(rows, memory, goals)
    print(table)
    config = run_config(args, rounds, load_before)
    print(f"\nconfig: {json.dumps(config)}")
    bh = next(
        r for r in rows if r["miner"] == "batch_hard" and r["batch"] == 1024 and r["distance"] == "cosine"
    )
    result = {
        "ratio": round(bh["pml_ms"] / bh["ours_ms"], 3),
        "ratio_meaning": "PML BatchHardMiner(CosineSimilarity()) time / our batch_hard (cosine) time at B=1024, same distance",
        "goals": goals,
        "rows": rows,
        "memory": memory,
        "config": config,
    }
    name = "miners" + ("" if args.threads == 2 else f"_threads{args.threads}")
    write_results(args.out, name, args.quick, result, table)


if __name__ == "__main__":
    main()
