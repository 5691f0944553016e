"""Which mining strategy wins on classes never seen in training? The glyphs benchmark.

Each recipe of ``yamls/glyphs_*.yaml`` (the same data, encoder, augmentation, loss and schedule; only
the mining, or the batch sampler, differs) trains with 3 seeds; every run is a fresh ``composer-dynsample train`` process.
The test classes are disjoint from the train classes and scored leave-one-out among themselves
(Musgrave et al. 2020): MAP@R, R-precision and Recall@1, mean and standard error over seeds. A
difference counts only beyond two standard errors of the difference.

    python benchmarks/quality_glyphs.py [--quick] [--seeds 0 1 2] [--threads 1] [--group GROUP]
        [--recipes NAME ...] [--merge] [--rebuild]

``make bench`` runs the mining strategies into ``results/quality_glyphs.*``, the samplers (hard-class
and neighbour batches against plain P x K, same miner and loss) into ``results/sampling_glyphs.*`` and
InfoNCE with growing pools against the default triplet recipe into ``results/contrastive_glyphs.*``.
The other groups explain those comparisons and are not part of ``make bench``: ``sampling_sweep``,
``contrastive_sweep`` and ``memory_sweep`` (why the samplers, the larger pools and the memory do not
pay) and ``long_glyphs`` (four times the epochs); they go to ``results/ablations/glyph_sweeps/``. ``--recipes`` reruns a few recipes of a group and
``--merge`` adds them to its stored results.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import tempfile
import time
from pathlib import Path

from _common import ablation_folder, machine_info, markdown_table, merged_recipes, save_figure, write_results
from _common import parser as make_parser
from _quality_runs import run_one

DEFAULT = "semi-hard -> batch-hard @10ep (default)"
_LONG = ["trainer.max_duration=80ep", "trainer.save_interval=20ep"]
RECIPES = {
    "random triplets": ("yamls/glyphs_random_triplets.yaml", []),
    "semi-hard": ("yamls/glyphs_semi_hard.yaml", []),
    "batch-hard": ("yamls/glyphs_batch_hard.yaml", []),
    DEFAULT: ("yamls/glyphs_default.yaml", []),
    "multi-similarity (miner + loss)": ("yamls/glyphs_multi_similarity.yaml", []),
    "hard-class P x K (table centroids)": ("yamls/glyphs_hard_class.yaml", []),
    "neighbour batches (table top-k)": ("yamls/glyphs_neighbours.yaml", []),
    "hard-class, hard_fraction 0.25": ("yamls/glyphs_hard_class.yaml", ["sampler.hard_fraction=0.25"]),
    "hard-class, hard_fraction 0.75": ("yamls/glyphs_hard_class.yaml", ["sampler.hard_fraction=0.75"]),
    "hard-class, semi-hard only": (
        "yamls/glyphs_hard_class.yaml",
        ["algorithms.hard_negative_mining.strategy=semi_hard"],
    ),
    "hard-class, table refreshed every epoch": (
        "yamls/glyphs_hard_class.yaml",
        ["algorithms.embedding_table.refresh_interval=1ep", "algorithms.embedding_table.refresh_max_age=0"],
    ),
    "neighbour batches without guards": (
        "yamls/glyphs_neighbours.yaml",
        ["sampler.skip_top=0", "sampler.max_relative_similarity=null"],
    ),
    "default + cross-batch memory 1024": (
        "yamls/glyphs_default.yaml",
        [
            "algorithms.hard_negative_mining.memory_size=1024",
            "algorithms.hard_negative_mining.memory_start=2ep",
        ],
    ),
    "InfoNCE, batch negatives": ("yamls/glyphs_infonce.yaml", []),
    "InfoNCE, mined negatives only": ("yamls/glyphs_infonce.yaml", ["model.loss.negatives=mined"]),
    "InfoNCE, batch + memory 1024": (
        "yamls/glyphs_infonce.yaml",
        [
            "algorithms.hard_negative_mining.memory_size=1024",
            "algorithms.hard_negative_mining.memory_start=2ep",
        ],
    ),
    "InfoNCE, B = 512 in chunks of 128": (
        "yamls/glyphs_infonce.yaml",
        ["sampler.classes_per_batch=128", "model.forward_chunk_size=128"],
    ),
    "InfoNCE, batch + memory 1024 from 10ep": (
        "yamls/glyphs_infonce.yaml",
        [
            "algorithms.hard_negative_mining.memory_size=1024",
            "algorithms.hard_negative_mining.memory_start=10ep",
        ],
    ),
    "InfoNCE, batch + memory 256": (
        "yamls/glyphs_infonce.yaml",
        [
            "algorithms.hard_negative_mining.memory_size=256",
            "algorithms.hard_negative_mining.memory_start=2ep",
        ],
    ),
    "InfoNCE, B = 512 in chunks of 128, 80 epochs (as many steps)": (
        "yamls/glyphs_infonce.yaml",
        [
            "sampler.classes_per_batch=128",
            "model.forward_chunk_size=128",
            "trainer.max_duration=80ep",
            "trainer.save_interval=20ep",
            "evaluation.interval=20ep",
        ],
    ),
    "InfoNCE, batch negatives, 80 epochs": (
        "yamls/glyphs_infonce.yaml",
        ["trainer.max_duration=80ep", "trainer.save_interval=20ep", "evaluation.interval=20ep"],
    ),
    "InfoNCE, batch negatives, no BatchNorm": ("yamls/glyphs_infonce.yaml", ["model.encoder.norm=none"]),
    "InfoNCE, batch + memory 256, no BatchNorm": (
        "yamls/glyphs_infonce.yaml",
        [
            "algorithms.hard_negative_mining.memory_size=256",
            "algorithms.hard_negative_mining.memory_start=2ep",
            "model.encoder.norm=none",
        ],
    ),
    "default, 80 epochs (batch-hard from 40ep)": (
        "yamls/glyphs_default.yaml",
        [*_LONG, 'algorithms.hard_negative_mining.strategy={"0ep": semi_hard, "40ep": batch_hard}'],
    ),
    "hard-class P x K, 80 epochs (batch-hard from 40ep)": (
        "yamls/glyphs_hard_class.yaml",
        [*_LONG, 'algorithms.hard_negative_mining.strategy={"0ep": semi_hard, "40ep": batch_hard}'],
    ),
    "hard-class, hard_fraction 0.25, 80 epochs (batch-hard from 40ep)": (
        "yamls/glyphs_hard_class.yaml",
        [
            *_LONG,
            'algorithms.hard_negative_mining.strategy={"0ep": semi_hard, "40ep": batch_hard}',
            "sampler.hard_fraction=0.25",
        ],
    ),
    "neighbour batches, 80 epochs (batch-hard from 40ep)": (
        "yamls/glyphs_neighbours.yaml",
        [*_LONG, 'algorithms.hard_negative_mining.strategy={"0ep": semi_hard, "40ep": batch_hard}'],
    ),
    "InfoNCE + hard-class P x K, 80 epochs": (
        "yamls/glyphs_hard_class.yaml",
        [*_LONG, "model.loss={name: info_nce, temperature: 0.1}"],
    ),
    "semi-hard + cross-batch memory 1024": (
        "yamls/glyphs_semi_hard.yaml",
        [
            "algorithms.hard_negative_mining.memory_size=1024",
            "algorithms.hard_negative_mining.memory_start=2ep",
        ],
    ),
    "default + cross-batch memory 1024 from 10ep": (
        "yamls/glyphs_default.yaml",
        [
            "algorithms.hard_negative_mining.memory_size=1024",
            "algorithms.hard_negative_mining.memory_start=10ep",
        ],
    ),
}
# Which recipes each results file compares: the mining strategies, and the
# model-aware samplers against plain P x K with the default miner and loss.
GROUPS = {
    "quality_glyphs": [
        "random triplets", "semi-hard", "batch-hard", DEFAULT, "multi-similarity (miner + loss)",
        "default + cross-batch memory 1024",
    ],
    "sampling_glyphs": [DEFAULT, "hard-class P x K (table centroids)", "neighbour batches (table top-k)"],
    # InfoNCE against the default triplet recipe, and larger pools: a memory, or a 4x batch in chunks.
    "contrastive_glyphs": [
        DEFAULT, "InfoNCE, batch negatives", "InfoNCE, mined negatives only", "InfoNCE, batch + memory 1024",
        "InfoNCE, B = 512 in chunks of 128",
    ],
    # Why the larger pools do not pay: the memory's start and size, and the 4x batch at equal steps.
    "contrastive_sweep": [
        "InfoNCE, batch + memory 1024 from 10ep", "InfoNCE, batch + memory 256",
        "InfoNCE, B = 512 in chunks of 128, 80 epochs (as many steps)", "InfoNCE, batch negatives, 80 epochs",
    ],
    # Why the memory costs the triplet recipe: batch-hard against it, or the memory's early start.
    "memory_sweep": [
        "semi-hard", "semi-hard + cross-batch memory 1024", "default + cross-batch memory 1024 from 10ep",
        "InfoNCE, batch negatives, no BatchNorm", "InfoNCE, batch + memory 256, no BatchNorm",
    ],
    # Four times the epochs (the 20-epoch recipes are far from converged): do hard classes pay there?
    "long_glyphs": [
        "default, 80 epochs (batch-hard from 40ep)", "hard-class P x K, 80 epochs (batch-hard from 40ep)",
        "InfoNCE, batch negatives, 80 epochs", "InfoNCE + hard-class P x K, 80 epochs",
        "hard-class, hard_fraction 0.25, 80 epochs (batch-hard from 40ep)",
        "neighbour batches, 80 epochs (batch-hard from 40ep)",
    ],
    # Why the samplers do not pay (yet): the hard fraction, the miner, the table's staleness, the guards.
    "sampling_sweep": [
        "hard-class, hard_fraction 0.25", "hard-class, hard_fraction 0.75", "hard-class, semi-hard only",
        "hard-class, table refreshed every epoch", "neighbour batches without guards",
    ],
}  # fmt: skip
#: The groups that explain the headline ones; their results go to ``results/ablations/glyph_sweeps``.
SWEEPS = ("contrastive_sweep", "memory_sweep", "long_glyphs", "sampling_sweep")
METRICS = ("map_at_r", "r_precision", "recall_at_1")


def summarise(runs: list[dict]) -> dict:
    """Mean and standard error over seeds of every metric, and the runs' times."""
    out: dict = {"runs": runs}
    for metric in METRICS:
        values = [run[metric] for run in runs]
        out[metric] = statistics.fmean(values)
        out[f"{metric}_std"] = statistics.stdev(values) if len(values) > 1 else 0.0
        out[f"{metric}_se"] = out[f"{metric}_std"] / math.sqrt(len(values))
    out["fit_s_max"] = max(run["fit_s"] for run in runs)
    out["process_s_max"] = max(run["process_s"] for run in runs)
    return out


def verdict(recipes: dict, metric: str = "map_at_r") -> dict:
    """The best recipe by ``metric`` and, for each other, whether it is behind by more than 2 standard errors."""
    best = max(recipes, key=lambda name: recipes[name][metric])
    gaps = {}
    for name, result in recipes.items():
        if name == best:
            continue
        gap = recipes[best][metric] - result[metric]
        se = math.hypot(recipes[best][f"{metric}_se"], result[f"{metric}_se"])
        one_seed = len(result["runs"]) < 2
        gaps[name] = {"gap": gap, "se_of_gap": se, "beyond_2se": None if one_seed else gap > 2 * se}
    return {"best": best, "metric": metric, "behind": gaps}


def plot(recipes: dict, path: Path) -> None:
    from matplotlib.figure import Figure

    figure = Figure(figsize=(9.5, 4.2))
    axes = figure.subplots(1, len(METRICS))
    names = list(recipes)
    for ax, metric in zip(axes, METRICS):
        means = [recipes[n][metric] for n in names]
        errors = [2 * recipes[n][f"{metric}_se"] for n in names]
        ax.barh(range(len(names)), means, xerr=errors, color="tab:blue", alpha=0.7, capsize=3)
        for row, name in enumerate(names):
            ax.plot(
                [r[metric] for r in recipes[name]["runs"]], [row] * len(recipes[name]["runs"]), "k.", ms=4
            )
        ax.set_yticks(range(len(names)), names if metric == METRICS[0] else [""] * len(names), fontsize=8)
        low = min(min(r[metric] for r in recipes[n]["runs"]) for n in names)
        ax.set_xlim(max(0.0, low - 0.05), min(1.0, max(means) + 0.05))
        ax.set_title(metric.replace("_", " "), fontsize=9)
    figure.suptitle(
        "glyphs, unseen test classes, leave-one-out: mean +- 2 SE over seeds, dots = seeds", fontsize=9
    )
    save_figure(figure, path)


def table(recipes: dict, seeds: list[int], decision: dict) -> str:
    rows = [
        [
            name,
            *(f"{r[m]:.4f} +- {r[m + '_se']:.4f} (sd {_std(r, m):.4f})" for m in METRICS),
            f"{r['fit_s_max']:.0f}",
        ]
        for name, r in recipes.items()
    ]
    text = markdown_table(["recipe", "MAP@R", "R-precision", "Recall@1", "max train s"], "lrrrr", rows)
    words = {True: "beyond 2 SE", False: "within 2 SE", None: "one seed: no error estimate"}
    behind = ", ".join(
        f"{name} by {gap['gap']:.4f} ({words[gap['beyond_2se']]})" for name, gap in decision["behind"].items()
    )
    return (
        f"Glyphs (unseen test classes, leave-one-out), {len(seeds)} seed(s): mean +- standard error "
        f"(sd: standard deviation over seeds).\n\n{text}\n\n"
        f"Best by MAP@R: **{decision['best']}**; the others are behind: {behind}."
    )


def _std(result: dict, metric: str) -> float:
    values = [run[metric] for run in result["runs"]]
    return statistics.stdev(values) if len(values) > 1 else 0.0


def rebuild(out: Path, group: str) -> dict:
    """Rewrite ``GROUP.md`` and ``GROUP.png`` from ``GROUP.json`` (a change of presentation, no new runs)."""
    result = json.loads((out / f"{group}.json").read_text())
    text = table(result["recipes"], result["seeds"], result["verdict"])
    return write_results(out, group, False, result, text, plot=lambda path: plot(result["recipes"], path))


def main(argv: list[str] | None = None) -> dict:
    parser = make_parser(__doc__, quick_help="one seed, 1 epoch, 4 faces per train class: a smoke test")
    parser.add_argument("--seeds", type=int, nargs="+", default=None)
    parser.add_argument("--threads", type=int, default=1, help="OMP_NUM_THREADS of each run")
    parser.add_argument("--recipes", nargs="+", default=None, help="run only these recipe names")
    parser.add_argument("--group", choices=sorted(GROUPS), default="quality_glyphs", help="which comparison")
    parser.add_argument(
        "--rebuild", action="store_true", help="rewrite the .md and .png from the .json, no runs"
    )
    parser.add_argument(
        "--merge",
        action="store_true",
        help="keep the group's stored recipes that this run does not redo (with --recipes: rerun a few)",
    )
    args = parser.parse_args(argv)
    if args.group in SWEEPS:
        args.out = ablation_folder(args.out, "glyph_sweeps")
    if args.rebuild:
        return rebuild(args.out, args.group)
    seeds = args.seeds if args.seeds is not None else ([0] if args.quick else [0, 1, 2])
    quick = (
        ["trainer.max_duration=1ep", "evaluation.interval=null", "data.faces_per_class=4"]
        if args.quick
        else []
    )
    chosen = {name: RECIPES[name] for name in (args.recipes or GROUPS[args.group])}
    started, load_before = time.time(), os.getloadavg()
    recipes = {}
    with tempfile.TemporaryDirectory(prefix="dynsample-glyphs-") as work:
        for name, (config, overrides) in chosen.items():
            runs = []
            for seed in seeds:
                run_dir = Path(work) / f"{Path(config).stem}-{len(recipes)}" / f"seed{seed}"
                run = run_one(
                    config, seed, run_dir, [*overrides, *quick, "evaluation.interval=null"], args.threads
                )
                print(f"{name:<42} seed {seed}: MAP@R {run['map_at_r']:.4f}  Recall@1 {run['recall_at_1']:.4f}  "
                      f"train {run['fit_s']:.1f} s", flush=True)  # fmt: skip
                runs.append(run)
            recipes[name] = summarise(runs)
    if args.merge:
        stored = args.out / f"{args.group}.json"
        recipes = merged_recipes(stored, recipes, seeds, GROUPS[args.group], keep_others=True)
    decision = verdict(recipes)
    text = table(recipes, seeds, decision)
    print(f"\n{text}")
    result = {
        "ratio": recipes[decision["best"]]["map_at_r"] / min(r["map_at_r"] for r in recipes.values()),
        "ratio_meaning": "best recipe's mean MAP@R / worst recipe's, glyphs (unseen classes, leave-one-out)",
        "verdict": decision,
        "seeds": seeds,
        "recipes": recipes,
        "threads": args.threads,
        "machine": machine_info(torch_threads=False),
        "load_average_before": [round(v, 2) for v in load_before],
        "load_average_after": [round(v, 2) for v in os.getloadavg()],
        "total_s": round(time.time() - started, 1),
    }
    return write_results(
        args.out, args.group, args.quick, result, text,
        plot=lambda path: plot(recipes, path),
    )  # fmt: skip


if __name__ == "__main__":
    main()
