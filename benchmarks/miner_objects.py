"""What the miner objects cost per call: a miner built once against the bare path.

Every miner is a class whose ``__call__`` validates the inputs, indexes the positives and calls the
miner's ``mine``. The bare path is that same work written out by hand, with no object in between:
check the options, validate the inputs, build the label index, call ``mine``. The two are timed side by
side (interleaved round by round, median), on L2-normalised random embeddings (D = 128, 8 samples per
class) at B = 32 (where a fixed per-call cost shows most), 256 and 1024, for every miner.

Goal: the object within 5% of the bare path at B >= 256, where training runs; at B = 32 the added cost
is reported in microseconds.

Run:

    python benchmarks/miner_objects.py [--quick] [--out benchmarks/results] [--threads 2]
"""

from __future__ import annotations

import json
from collections.abc import Callable

import torch
import torch.nn.functional as F
from _common import (
    goal_table,
    in_units,
    load_average,
    machine_info,
    markdown_table,
    time_interleaved,
    write_results,
)
from _common import parser as make_parser

from composer_dynsample.mining import MINERS, BaseMiner
from composer_dynsample.mining._common import LabelIndex, validate_mining_inputs

DIM = 128
PER_CLASS = 8
OPTIONS: dict[str, dict] = {
    "batch_hard": {},
    "semi_hard": {"margin": 0.2},
    "hard_topk": {"k": 3},
    "distance_weighted": {},
    "multi_similarity": {"epsilon": 0.1},
    "random_triplets": {},
}
GOAL = 1.05


def make_batch(batch: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return F.normalize(torch.randn(batch, DIM, generator=gen), dim=1), torch.arange(batch) // PER_CLASS


def bare_call(name: str) -> Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, ...]]:
    """The miner's work with no object around it: options checked, inputs validated, index, ``mine``."""
    miner_class, options = MINERS[name], OPTIONS[name]

    def call(emb: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, ...]:
        miner = miner_class(**options)  # the options, checked on every call
        with torch.no_grad():
            inputs = validate_mining_inputs(emb, labels, distance=miner.distance)
            if not miner_class.uses_label_index:
                return miner.mine(inputs, None)
            index = LabelIndex(inputs.labels, inputs.ref_labels, inputs.self_offset)
            if not bool((index.n_pos > 0).any()):  # a batch without positives mines nothing
                return miner.empty(inputs.device)
            return miner.mine(inputs, index)

    return call


def measure(name: str, batch: int, rounds: int) -> dict:
    emb, labels = make_batch(batch)
    miner: BaseMiner = MINERS[name](**OPTIONS[name])
    bare = bare_call(name)
    # Random miners draw from the global generator: the same number of draws per call on each path.
    times = time_interleaved(
        {"bare": lambda: bare(emb, labels), "object": lambda: miner(emb, labels)}, rounds, warmup=3
    )
    return {
        "miner": name,
        "batch": batch,
        **in_units(times, "us", 1),
        "object_over_bare": round(times["object"] / times["bare"], 3),
        "object_added_us": round((times["object"] - times["bare"]) * 1e6, 1),
    }


def goal_rows(rows: list[dict]) -> list[dict]:
    large = [r for r in rows if r["batch"] >= 256]
    worst_object = max(large, key=lambda r: r["object_over_bare"])
    return [
        {
            "goal": f"miner object <= {GOAL}x the bare path (every miner, B >= 256)",
            "measured": f"worst {worst_object['object_over_bare']:.3f}x ({worst_object['miner']}, B={worst_object['batch']})",
            "met": worst_object["object_over_bare"] <= GOAL,
        },
    ]


def tables(rows: list[dict], goals: list[dict]) -> str:
    timing = markdown_table(
        ["B", "miner", "bare (us)", "object (us)", "object / bare"],
        "rlrrr",
        [
            [r["batch"], r["miner"], r["bare_us"], r["object_us"], f"{r['object_over_bare']:.3f}"]
            for r in rows
        ],
    )
    return timing + "\n\n" + goal_table(goals)


def main() -> None:
    parser = make_parser(__doc__, quick_help="B = 32 and 256 only, 15 rounds", threads=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    load_before = load_average()
    batches = (32, 256) if args.quick else (32, 256, 1024)
    rows = []
    for batch in batches:
        rounds = 15 if args.quick else {32: 301, 256: 101, 1024: 31}[batch]
        rows += [measure(name, batch, rounds) for name in MINERS]
    goals = goal_rows(rows)
    table = tables(rows, goals)
    print(table)
    config = {
        "quick": args.quick,
        "threads": args.threads,
        "machine": machine_info(),  # cores, threads, python, torch and composer versions
        "load_average_1_5_15min_before": load_before,
        "load_average_1_5_15min_after": load_average(),
    }
    print(f"\nconfig: {json.dumps(config)}")
    worst = max((r for r in rows if r["batch"] >= 256), key=lambda r: r["object_over_bare"])
    result = {
        "ratio": worst["object_over_bare"],
        "ratio_meaning": "worst miner-object time / bare-path time over every miner at B >= 256",
        "goals": goals,
        "rows": rows,
        "config": config,
    }
    write_results(args.out, "miner_objects", args.quick, result, table)


if __name__ == "__main__":
    main()
