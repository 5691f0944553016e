"""Hard negatives chosen by the model being trained, on code search: online against offline and in-batch.

The code-search task of ``quality_code.py`` (CodeSearchNet's MRR of docstring queries against the code of
packages never seen in training), the same encoder, optimizer, pairs per step and epochs for every
recipe; only where the batch's negatives come from changes:

- **in-batch**: ``yamls/code_search.yaml``, P x K = 256 pairs, every other text of the batch a negative.
- **random negatives**: the mined-negatives batch layout (256 pairs and one passage of another pair per
  query, 768 texts) with random passages: the control for the bigger batch.
- **offline mined**: ``yamls/code_search_mined.yaml`` with ``sampler.max_snapshots=1``: negatives mined
  once from the table after the first (warm-up) epoch, re-encoded by that epoch's model (the table's
  ``refresh_interval: 1ep``), then fixed, as ``mine_hard_negatives`` or TAS-B's clustering are used.
- **online confusable pairs**: ``yamls/code_search_hard_pairs.yaml``, batches of pairs whose centroids
  in the table are near (TAS-B refreshed every epoch), 512 texts.
- **online mined**: ``yamls/code_search_mined.yaml``: each query's passage negative drawn from its 8
  nearest passages of other pairs in the table, refreshed every epoch from the rows the forward pass wrote.
- **online mined + confusable pairs**: both (``sampler.hard_fraction=0.5``).
- **512-d encoder**: in-batch and online mined again with 512-d token vectors and embeddings (the
  ablations suggest the encoder's capacity decides what hard negatives can give).

BM25 is the reference line. A difference counts only beyond two standard errors of the difference of
the means. Every run's table staleness (batches since each row was written, mean and max at each epoch
end) and the share of negatives the guards left to random draws are kept. Writes
``results/quality_mined.{json,md,png}``; ``ratio`` is the best online recipe's mean CSN MRR / in-batch's.

    python benchmarks/quality_mined.py [--quick] [--seeds 0 1 2] [--jobs 2] [--recipes NAME ...] [--merge]
    python benchmarks/quality_mined.py --group why [--jobs 2]   # one change at a time, one seed
"""

from __future__ import annotations

import json
import math
import os
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from _common import ablation_folder, machine_info, markdown_table, merged_recipes, write_results
from _common import parser as make_parser
from _quality_runs import run_command
from quality_code import METRICS, bm25, code_search_record, plot, read_pairs, summarise
from quality_code import table as code_table

PLAIN, MINED, PAIRS = (
    "yamls/code_search.yaml",
    "yamls/code_search_mined.yaml",
    "yamls/code_search_hard_pairs.yaml",
)
IN_BATCH, OFFLINE = "in-batch negatives", "offline mined (after epoch 1, fixed)"
ONLINE_PAIRS, ONLINE_MINED = "online confusable pairs", "online mined corpus negatives"
BOTH, RANDOM = "online mined + confusable pairs", "random corpus negatives (control)"
RECIPES: dict[str, tuple[str, list[str]]] = {
    IN_BATCH: (PLAIN, []),
    RANDOM: (MINED, ["algorithms.embedding_table.feed_sampler=false"]),
    OFFLINE: (MINED, ["sampler.max_snapshots=1", "algorithms.embedding_table.refresh_interval=1ep"]),
    ONLINE_PAIRS: (PAIRS, []),
    ONLINE_MINED: (MINED, []),
    BOTH: (MINED, ["sampler.hard_fraction=0.5"]),
}
WIDE = ["model.encoder.token_dim=512", "model.encoder.embedding_dim=512"]
WIDE_IN_BATCH, WIDE_MINED = (
    "in-batch negatives, 512-d encoder",
    "online mined corpus negatives, 512-d encoder",
)
RECIPES.update({WIDE_IN_BATCH: (PLAIN, WIDE), WIDE_MINED: (MINED, WIDE)})
ONLINE = (ONLINE_PAIRS, ONLINE_MINED, BOTH, WIDE_MINED)
#: The in-batch and offline recipes an online one is compared with (the same encoder).
BASELINES = {WIDE_MINED: (WIDE_IN_BATCH,)}
#: ``--group why``, one seed each: what changes online mining's gain (each against the main table).
WHY: dict[str, tuple[str, list[str]]] = {
    "guards: NV-Retriever's margin 0.95": (MINED, ["sampler.max_relative_similarity=0.95"]),
    "guards: rank window, skip the 2 nearest, draw from 32": (
        MINED,
        ["sampler.skip_top=2", "sampler.window=32"],
    ),
    "hardness: always the nearest passage (window 1)": (MINED, ["sampler.window=1"]),
    "more negatives: 3 per query (1,280 texts a batch)": (
        MINED,
        ["sampler.negatives_per_anchor=3", "sampler.window=12"],
    ),
    "refresh period: every 10 steps as well": (MINED, ["sampler.refresh_every=10"]),
    "staleness: table re-encoded at every epoch start": (
        MINED,
        ["algorithms.embedding_table.refresh_interval=1ep"],
    ),
    "capacity: 512-d token vectors and embeddings": (MINED, WIDE),
    "capacity: 512-d, in-batch negatives (code_search.yaml)": (PLAIN, WIDE),
}


def run_recipe(config: str, overrides: list[str], seed: int, run_dir: Path, threads: int) -> dict:
    """One training process: its test metrics, times, table staleness and the sampler's counts."""
    metrics, seconds = run_command(config, seed, run_dir, overrides, threads)
    run = {"seed": seed, "process_s": round(seconds, 2), "fit_s": metrics["wall_time_s"]}
    for name in METRICS:
        run[name] = metrics[name.replace("@", "_at_")]
    run["s_per_step"] = metrics["wall_time_s"] / metrics["batches"]
    history = metrics.get("embedding_table") or []
    if history:
        run["staleness_mean"] = [round(epoch["staleness_mean"], 2) for epoch in history]
        run["staleness_max"] = [epoch["staleness_max"] for epoch in history]
        counts = [epoch["sampler"] for epoch in history if "sampler" in epoch]
        if counts:
            slots = [c["random"] for c in counts]
            run["random_negatives"] = slots
            run["margin_dropped"] = [c["margin"] for c in counts]
            run["duplicate_dropped"] = [c["duplicate"] for c in counts]
    return run


def difference(a: dict, b: dict, metric: str = "csn_mrr") -> tuple[float, float]:
    """``mean(a) - mean(b)`` and the standard error of that difference."""
    return a[metric] - b[metric], math.sqrt(a[f"{metric}_se"] ** 2 + b[f"{metric}_se"] ** 2)


def verdict(baseline: dict, recipes: dict) -> list[str]:
    """One line per online recipe: its CSN MRR against in-batch, offline and BM25, beyond 2 SE or not."""
    lines = []
    for name in (n for n in ONLINE if n in recipes):
        parts = []
        for other in BASELINES.get(name, (IN_BATCH, OFFLINE)):
            if other in recipes:
                gap, se = difference(recipes[name], recipes[other])
                beyond = "beyond 2 SE" if abs(gap) > 2 * se else "within 2 SE"
                parts.append(f"{gap:+.4f} vs {other} ({beyond}, SE {se:.4f})")
        gap = recipes[name]["csn_mrr"] - baseline["csn_mrr"]
        parts.append(f"{gap:+.4f} vs BM25")
        lines.append(f"- **{name}**: " + "; ".join(parts) + ".")
    return lines


def ratio(recipes: dict, best: str | None) -> float | None:
    """The best online recipe's mean CSN MRR over its own encoder's in-batch recipe's."""
    baseline = BASELINES.get(best, (IN_BATCH,))[0] if best else None
    return recipes[best]["csn_mrr"] / recipes[baseline]["csn_mrr"] if baseline in recipes else None


def staleness_table(recipes: dict) -> str:
    """Per recipe with a table: mean and max staleness at the last epoch end and random negatives."""
    rows = [
        "| recipe | staleness at epoch ends, mean (batches) | max | random negatives per epoch |",
        "|---|---|---|---|",
    ]
    for name, result in recipes.items():
        run = result["runs"][0]
        if "staleness_mean" not in run:
            continue
        randoms = ", ".join(str(v) for v in run.get("random_negatives", [])) or "-"
        means = ", ".join(f"{v:.1f}" for v in run["staleness_mean"])
        rows.append(f"| {name} | {means} | {int(max(run['staleness_max']))} | {randoms} |")
    return "\n".join(rows)


def run_all(chosen: dict, seeds: list[int], quick: list[str], jobs: int, threads: int) -> dict:
    """Every recipe on every seed, ``jobs`` processes at a time: ``{name: summary}``."""
    with (
        tempfile.TemporaryDirectory(prefix="dynsample-mined-") as work,
        ThreadPoolExecutor(jobs) as pool,
    ):
        futures = {
            (name, seed): pool.submit(
                run_recipe, config, [*overrides, *quick], seed, Path(work) / f"r{number}s{seed}", threads
            )
            for number, (name, (config, overrides)) in enumerate(chosen.items())
            for seed in seeds
        }
        recipes = {}
        for name in chosen:
            runs = [futures[name, seed].result() for seed in seeds]
            for run in runs:
                print(
                    f"{name:<48} seed {run['seed']}: CSN MRR {run['csn_mrr']:.4f}  train {run['fit_s']:.0f} s"
                )
            recipes[name] = summarise(runs)
    return recipes


def why(args) -> dict:
    """The ablations of the online mined recipe, one seed each, against the main table's means."""
    seeds = args.seeds if args.seeds is not None else [0]
    quick = ["trainer.max_duration=2ep", "data.max_pairs_per_group=20"] if args.quick else []
    chosen = {name: WHY[name] for name in (args.recipes or WHY)}
    started = time.time()
    recipes = run_all(chosen, seeds, quick, args.jobs, args.threads)
    folder = ablation_folder(args.out, "why_mined_pays")
    stored = folder / "quality_mined_why.json"
    if args.merge and stored.exists():
        merged = {**json.loads(stored.read_text())["recipes"], **recipes}
        recipes = {name: merged[name] for name in WHY if name in merged}
    main_results = args.out / "quality_mined.json"
    reference = (
        json.loads(main_results.read_text())["recipes"] if main_results.exists() and not args.quick else {}
    )
    rows = []
    for name, result in recipes.items():
        run = result["runs"][0]
        against = [
            f"{result['csn_mrr'] - reference[other]['csn_mrr']:+.4f}" if other in reference else "-"
            for other in (ONLINE_MINED, IN_BATCH)
        ]
        randoms = run.get("random_negatives", [])
        rows.append(
            [name, f"{result['csn_mrr']:.4f}", *against, f"{result['mrr@10']:.4f}",
             str(sum(randoms[1:])) if randoms else "-", f"{run['fit_s']:.0f}"]
        )  # fmt: skip
    headers = ["change to yamls/code_search_mined.yaml", "CSN MRR", "vs online mined (mean)", "vs in-batch (mean)", "MRR@10", "random negatives after epoch 1", "train s"]  # fmt: skip
    text = (
        f"Online mined negatives on code search, one change at a time, seed(s) {seeds}; differences against "
        "the 3-seed means of quality_mined.md (their standard errors are about 0.002).\n\n"
        + markdown_table(headers, "lrrrrrr", rows)
    )
    print(text)
    result = {
        "ratio": max(r["csn_mrr"] for r in recipes.values()) / reference[ONLINE_MINED]["csn_mrr"]
        if ONLINE_MINED in reference
        else None,
        "ratio_meaning": "best ablation's CSN MRR / the online mined recipe's 3-seed mean",
        "recipes": recipes,
        "seeds": seeds,
        "jobs": args.jobs,
        "machine": machine_info(torch_threads=False),
        "total_s": round(time.time() - started, 1),
    }
    return write_results(folder, "quality_mined_why", args.quick, result, text)


def main(argv: list[str] | None = None) -> dict:
    parser = make_parser(__doc__, quick_help="one seed, 2 epochs on a small corpus: a smoke test")
    parser.add_argument("--seeds", type=int, nargs="+", default=None)
    parser.add_argument("--threads", type=int, default=1, help="OMP_NUM_THREADS of each run")
    parser.add_argument("--jobs", type=int, default=1, help="training processes at a time")
    parser.add_argument("--recipes", nargs="+", default=None, help="run only these recipe names")
    parser.add_argument("--merge", action="store_true", help="keep the stored recipes this run does not redo")
    parser.add_argument(
        "--group", choices=("main", "why"), default="main", help="the comparison, or its ablations (one seed)"
    )
    args = parser.parse_args(argv)
    if args.group == "why":
        return why(args)
    seeds = args.seeds if args.seeds is not None else ([0] if args.quick else [0, 1, 2])
    small = {"max_pairs_per_group": 20} if args.quick else {}
    quick = ["trainer.max_duration=2ep", "data.max_pairs_per_group=20"] if args.quick else []
    from composer_dynsample.data.text.code_search import build_code_search

    corpus = build_code_search(**small)
    baseline = bm25(read_pairs(corpus.test_path))
    chosen = {name: RECIPES[name] for name in (args.recipes or RECIPES)}
    started = time.time()
    recipes = run_all(chosen, seeds, quick, args.jobs, args.threads)
    if args.merge:
        recipes = merged_recipes(args.out / "quality_mined.json", recipes, seeds, RECIPES)
    lines = verdict(baseline, recipes)
    text = "\n\n".join([code_table(baseline, recipes, seeds), "\n".join(lines), staleness_table(recipes)])
    print(f"\n{text}")
    online = [name for name in ONLINE if name in recipes]
    best = max(online, key=lambda name: recipes[name]["csn_mrr"]) if online else None
    result = {
        "ratio": ratio(recipes, best),
        "ratio_meaning": "best online recipe's mean CodeSearchNet MRR / in-batch InfoNCE's with the same encoder",
        "best_online": best,
        "jobs": args.jobs,
        **code_search_record(baseline, recipes, seeds, corpus, args.threads, started),
    }
    return write_results(
        args.out, "quality_mined", args.quick, result, text, plot=lambda path: plot(baseline, recipes, path)
    )


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
