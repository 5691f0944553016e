"""The switches of the mined fine-tuning recipes, one at a time: what makes negatives from the model being
trained (online) better or worse than negatives mined once (offline).

Each variant is one of ``finetune_code.py``'s two mined recipes, **offline** (one mined negative per query
from the warm embedding table, mined once by the starting model) or **online** (the same, refreshed from the
table every ``--refresh-every`` steps), with config overrides for one switch:

- the positive-aware margin (``sampler.max_relative_similarity``, sentence-transformers' ``relative_margin``);
- sampling from the window by similarity (``sampler.sampling``: softmax by Gumbel-max) instead of uniformly;
- the rank window 10 to 50 of sentence-transformers' examples (``sampler.skip_top``, ``sampler.window``);
- fresher rows: the anchors and positives of each snapshot's batches re-encoded by the current model in eval
  mode before the search (``algorithms.embedding_table.fresh_upcoming``), every row (``fresh_upcoming: all``,
  ANCE's refresh of the whole index at each snapshot), or 64 of the stalest rows a step
  (``fresh_rows_per_step``);
- the lists checked (``algorithms.embedding_table.list_drift``): plain online, with each snapshot's candidate
  lists compared with those of every row encoded afresh by the current model, and with the first snapshot's
  (what mining once keeps), a diagnostic that trains exactly as plain online;
- the ADORE mode: the passage side frozen (``model.encoder``: two towers from the same folder,
  ``frozen_passages: true``), so the table's passage rows are exact, with the anchors re-encoded (online) or
  mined once (offline).

Two variants of the **in-batch** recipe (InfoNCE over the batch, no mining) compare Matryoshka training: plain
(``in_batch``, scored at 256, 128 and 64 dimensions too by ``evaluation.matryoshka_dims``) and
``in_batch_matryoshka`` (``model.loss.matryoshka_dims=[384,256,128,64]``); the table gives both the CSN MRR and
MRR@10 at 64 dimensions and, below it, at every dimension.

Every variant runs ``finetune_code.py --recipes RECIPE --override ...`` (3 seeds at the CPU size, the same
corpus, steps, batch, learning rate and evaluation) into ``results/ablations/finetune_recipe/STEM.json``, only where that file is
missing (``--redo`` runs it again); the gathered table, with each run's false-negative and drift figures
(the share of kept candidates scoring above the positive at the first and the last snapshot, and how far the
fresh encodings moved from the rows they replaced), goes to ``results/ablations/finetune_recipe/finetune_code_ablation.{json,md,png}``.
A difference counts only beyond two standard errors over seeds.

    python benchmarks/finetune_ablation.py [--variants NAME ...] [--seeds 0 1 2] [--steps N] [--redo]
        [--report] [--model DIR] [--quick]

``--steps N`` runs every variant N steps instead of the CPU size's 60 (187: one epoch of the 3,000 pairs);
its results are stored as ``STEM_sN`` and gathered into ``finetune_code_ablation_sN``.
"""

from __future__ import annotations

import json
import math
import statistics
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import _finetune_report as report
from _common import ablation_folder, markdown_table, save_figure, write_results
from _common import parser as make_parser
from _pretrained import minilm_folder

HERE = Path(__file__).resolve().parent
NAME = "finetune_code_ablation"
#: The folder below ``--out`` (``results/ablations/finetune_recipe``) that holds every variant and the table.
QUESTION = "finetune_recipe"


@dataclass(frozen=True)
class Variant:
    """One switch on one mined recipe: its overrides (``{model}``: the model folder), what it changes,
    and the stem of its ``finetune_code.py`` results."""

    recipe: str
    overrides: tuple[str, ...]
    change: str
    stem: str


_FRESH = "algorithms.embedding_table={warm_start: true, fresh_upcoming: true}"
_FROZEN = (
    "model.encoder={name: two_tower, frozen_passages: true, query_encoder: {name: transformer, path: '{model}'}, "
    "passage_encoder: {name: transformer, path: '{model}'}}",
)
ONLINE, OFFLINE, IN_BATCH = report.OURS_ONLINE, report.OURS_OFFLINE, report.OURS_IN_BATCH
#: The dimensions the in-batch variants are scored at beside the full width (all-MiniLM-L6-v2's 384).
_DIMS = "[384,256,128,64]"
VARIANTS: dict[str, Variant] = {
    "in_batch": Variant(
        IN_BATCH,
        (f"evaluation.matryoshka_dims={_DIMS}",),
        "plain InfoNCE, scored at 256/128/64 too",
        "finetune_code_abl_in_batch",
    ),
    "in_batch_matryoshka": Variant(
        IN_BATCH,
        (f"model.loss.matryoshka_dims={_DIMS}",),
        "Matryoshka InfoNCE at 384/256/128/64",
        "finetune_code_abl_in_batch_matryoshka",
    ),
    "offline": Variant(OFFLINE, (), "uniform in the top 8, no margin", "finetune_code_abl_offline"),
    "online": Variant(ONLINE, (), "uniform in the top 8, no margin", "finetune_code_margin_none"),
    "online_margin_005": Variant(
        ONLINE, ("sampler.max_relative_similarity=0.95",), "relative margin 0.05", "finetune_code_margin_005"
    ),
    "online_margin_010": Variant(
        ONLINE, ("sampler.max_relative_similarity=0.90",), "relative margin 0.10", "finetune_code_margin_010"
    ),
    "offline_softmax": Variant(
        OFFLINE,
        ("sampler.sampling=softmax",),
        "softmax sampling at 0.05",
        "finetune_code_abl_offline_softmax",
    ),
    "online_softmax": Variant(
        ONLINE, ("sampler.sampling=softmax",), "softmax sampling at 0.05", "finetune_code_abl_online_softmax"
    ),
    "online_fresh": Variant(
        ONLINE, (_FRESH,), "anchors re-encoded before each snapshot", "finetune_code_abl_online_fresh"
    ),
    "online_stalest": Variant(
        ONLINE,
        ("algorithms.embedding_table={warm_start: true, fresh_rows_per_step: 64}",),
        "64 stalest rows re-encoded a step",
        "finetune_code_abl_online_stalest",
    ),
    "offline_frozen": Variant(
        OFFLINE, _FROZEN, "passage side frozen (ADORE), mined once", "finetune_code_abl_offline_frozen"
    ),
    "online_frozen": Variant(
        ONLINE,
        (*_FROZEN, _FRESH),
        "passage side frozen, anchors re-encoded (ADORE)",
        "finetune_code_abl_online_frozen",
    ),
    "online_all": Variant(
        ONLINE,
        ("algorithms.embedding_table={warm_start: true, fresh_upcoming: all}",),
        "every row re-encoded before each snapshot (ANCE's full refresh)",
        "finetune_code_abl_online_all",
    ),
    "online_lists": Variant(
        ONLINE,
        ("algorithms.embedding_table={warm_start: true, list_drift: true}",),
        "plain online, each snapshot's lists checked against the current model's (a diagnostic)",
        "finetune_code_abl_online_lists",
    ),
    "online_window": Variant(
        ONLINE,
        ("sampler.skip_top=10", "sampler.window=40"),
        "ranks 10 to 50, uniform",
        "finetune_code_abl_online_window",
    ),
}


def run_variant(name: str, args: Any) -> None:
    """Run one variant's ``finetune_code.py`` into its stem (the command is printed first)."""
    variant = VARIANTS[name]
    model = str(args.model or minilm_folder())
    overrides = [override.replace("{model}", model) for override in variant.overrides]
    command = [
        sys.executable,
        str(HERE / "finetune_code.py"),
        "--name",
        _stem(variant, args),
        "--out",
        str(args.out),
    ]
    command += ["--recipes", variant.recipe, "--seeds", *map(str, args.seeds), "--model", model]
    command += ["--quick"] if args.quick else []
    command += ["--steps", str(args.steps)] if args.steps else []
    command += ["--override", *overrides] if overrides else []
    print(f"{name}: {' '.join(command)}", flush=True)
    subprocess.run(command, check=True)


def _stem(variant: Variant, args: Any) -> str:
    """Where a variant's results are stored: its stem, with ``_sN`` for ``--steps N``."""
    return f"{variant.stem}_s{args.steps}" if args.steps else variant.stem


def stored(name: str, args: Any) -> dict[str, Any] | None:
    """A variant's stored result: its recipe's summary, the corpus and the options, or ``None``."""
    variant = VARIANTS[name]
    path = args.out / f"{_stem(variant, args)}{'_quick' if args.quick else ''}.json"
    if not path.exists():
        return None
    result = json.loads(path.read_text())
    summary = result["recipes"].get(variant.recipe)
    if summary is None:
        return None
    return {
        "summary": summary, "corpus": result["data"]["corpus_sha256"], "options": result["options"],
        "machine": result.get("machine"),
    }  # fmt: skip


def gather(names: list[str], args: Any) -> dict[str, Any]:
    """The variants' results side by side, each against its recipe's baseline and the best of the other
    recipe; the goal: the best online variant above the best offline one beyond two standard errors."""
    rows: dict[str, Any] = {}
    for name in names:
        found = stored(name, args)
        if found is not None:
            variant = VARIANTS[name]
            rows[name] = {
                "recipe": variant.recipe,
                "change": variant.change,
                "stem": _stem(variant, args),
                **found,
            }
    corpora = {json.dumps(row["corpus"], sort_keys=True) for row in rows.values()}
    best = {
        recipe: max(
            (name for name, row in rows.items() if row["recipe"] == recipe),
            key=lambda name: rows[name]["summary"]["csn_mrr"],
            default=None,
        )
        for recipe in (ONLINE, OFFLINE)
    }
    goals, ratio = [], None
    if best[ONLINE] and best[OFFLINE]:
        online, offline = rows[best[ONLINE]]["summary"], rows[best[OFFLINE]]["summary"]
        ratio = online["csn_mrr"] / offline["csn_mrr"]
        gap, two_se = _difference(online, offline)
        goals.append({
            "goal": f"best online ({best[ONLINE]}) above best offline ({best[OFFLINE]}), CSN MRR",
            "target": "> 2 SE", "value": f"{gap:+.4f} (2 SE {two_se:.4f})",
            "verdict": "met" if gap > two_se else "missed",
        })  # fmt: skip
    machines = sorted({str(row["machine"]) for row in rows.values() if row.get("machine")})
    return {
        "variants": rows, "best": best, "one_corpus": len(corpora) <= 1, "goals": goals, "ratio": ratio,
        "machine": "; ".join(machines) or None,
    }  # fmt: skip


def _difference(first: dict[str, Any], second: dict[str, Any]) -> tuple[float, float]:
    return first["csn_mrr"] - second["csn_mrr"], 2 * math.hypot(first["csn_mrr_se"], second["csn_mrr_se"])


#: Each recipe's baseline variant, and its short name in the table.
_BASELINE = {ONLINE: "online", OFFLINE: "offline", IN_BATCH: "in_batch"}


def _at(summary: dict[str, Any], dim: str, metric: str = "csn_mrr") -> str:
    """A variant's ``metric`` at a Matryoshka dimension, ``mean +- SE``, or ``-`` when it was not scored there."""
    values = summary.get("dims", {}).get(dim)
    return f"{values[metric]:.4f} +- {values[metric + '_se']:.4f}" if values else "-"


def table(result: dict[str, Any]) -> str:
    """One row per variant: its recipe and change, CSN MRR +- SE, the difference to its recipe's baseline,
    the mining figures (share above the positive at the first and last snapshot, drift, step time) and, for
    the variants scored at Matryoshka dimensions, CSN MRR and MRR@10 at 64 dimensions."""
    rows, variants = [], result["variants"]
    for name, row in variants.items():
        summary = row["summary"]
        base = variants.get(_BASELINE[row["recipe"]])
        delta = "-"
        if base is not None and base is not row:
            gap, two_se = _difference(summary, base["summary"])
            delta = f"{gap:+.4f} ({'beyond' if abs(gap) > two_se else 'within'} 2 SE {two_se:.4f})"
        share = (
            f"{summary['above_positive_first']:.3f} / {summary['above_positive_last']:.3f}"
            if "above_positive_first" in summary
            else "-"
        )
        drift = f"{summary['fresh_drift']:.4f}" if "fresh_drift" in summary else "-"
        rows.append([
            name, _BASELINE[row["recipe"]].replace("_", "-"), row["change"],
            f"{summary['csn_mrr']:.4f} +- {summary['csn_mrr_se']:.4f}", delta, share, drift,
            f"{summary.get('s_per_step', float('nan')):.2f}", _at(summary, "64"), _at(summary, "64", "mrr@10"),
        ])  # fmt: skip
    header = (
        "variant", "recipe", "switch", "CSN MRR", "vs its recipe's baseline", "above positive (first / last)",
        "fresh drift", "s a step", "CSN MRR at 64 dims", "MRR@10 at 64 dims",
    )  # fmt: skip
    scored = {name: row["summary"] for name, row in variants.items() if row["summary"].get("dims")}
    if not scored:  # no variant scored at Matryoshka dimensions: no columns for them
        header, rows = header[:-2], [row[:-2] for row in rows]
    return markdown_table(header, "lllrrrrrrr"[: len(header)], rows) + report.dims_table(scored)


def notes(result: dict[str, Any], args: Any) -> list[str]:
    lines = [
        "Each variant: `python benchmarks/finetune_code.py --name STEM --recipes RECIPE --override ...` "
        f"(its overrides in `benchmarks/finetune_ablation.py`), seeds {' '.join(map(str, args.seeds))}. "
        "'above positive': the share of kept candidates at least as similar to their anchor as its own "
        "positive, at the run's first and last snapshot (mean over seeds); 'fresh drift': one minus the mean "
        "cosine of a re-encoded row to the row it replaced.",
    ]
    if not result["one_corpus"]:
        lines.append("**The variants were run on different corpora** (the corpus depends on the installed "
                     "packages): compare them only with their own baselines.")  # fmt: skip
    for name, row in result["variants"].items():
        checks = row["summary"].get("list_drift")
        if checks:
            lines.append(list_drift_line(name, checks))
    for goal in result["goals"]:
        lines.append(f"Goal: {goal['goal']} {goal['target']}: {goal['value']}, **{goal['verdict']}**.")
    return lines


def list_drift_line(name: str, checks: list[dict[str, float]]) -> str:
    """The list checks of a variant run with ``list_drift``: at each snapshot, the share of the current
    model's kept candidates that the table's lists hold, and that the first snapshot's (mining once) hold.

    Example:
        >>> list_drift_line("v", [{"step": 0, "overlap_table": 1.0, "top1_table": 1.0, "overlap_first": 1.0,
        ...   "top1_first": 1.0, "seconds": 50.0}, {"step": 20, "overlap_table": 0.8, "top1_table": 0.7,
        ...   "overlap_first": 0.6, "top1_first": 0.5, "seconds": 52.0}]).split(": ", 1)[1][:80]
        'step 0: table 1.000 (top-1 1.000), first snapshot 1.000 (top-1 1.000); step 20: '
    """
    steps = "; ".join(
        f"step {check['step']:.0f}: table {check['overlap_table']:.3f} (top-1 {check['top1_table']:.3f}), "
        f"first snapshot {check['overlap_first']:.3f} (top-1 {check['top1_first']:.3f})"
        for check in checks
    )
    seconds = statistics.fmean(check["seconds"] for check in checks)
    return (
        f"{name}'s lists against those of every row encoded afresh by the current model (mean over seeds; the "
        f"share of its kept candidates each list holds, and how often the nearest is the same): {steps}. Each "
        f"check encodes the training set once more ({seconds:.0f} s here): the variant's s a step counts them."
    )


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(result["variants"])
    figure, ax = plt.subplots(figsize=(7.5, 0.45 * len(names) + 1.2))
    for y, name in enumerate(names):
        row = result["variants"][name]
        summary, recipe = row["summary"], _BASELINE[row["recipe"]]
        colour = {"online": "tab:orange", "offline": "tab:blue"}.get(recipe, "tab:green")
        ax.errorbar(
            summary["csn_mrr"], y, xerr=2 * summary["csn_mrr_se"], fmt="o", capsize=3, color=colour,
            label=recipe.replace("_", "-"),
        )  # fmt: skip
    ax.set_yticks(range(len(names)), names)
    ax.invert_yaxis()
    handles, labels = ax.get_legend_handles_labels()
    unique = dict(zip(labels, handles))
    ax.legend(unique.values(), unique.keys(), loc="lower right")
    ax.set_xlabel("CodeSearchNet MRR (mean +- 2 SE over seeds)")
    ax.set_title("Mined fine-tuning recipes, one switch at a time")
    ax.grid(alpha=0.3)
    save_figure(figure, path)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = make_parser(__doc__, quick_help="the variants on finetune_code's --quick size, one seed")
    parser.add_argument("--variants", nargs="+", choices=list(VARIANTS), default=list(VARIANTS))
    parser.add_argument("--seeds", type=int, nargs="+", default=None)
    parser.add_argument("--steps", type=int, default=None, help="steps of every run (default: the size's)")
    parser.add_argument(
        "--model", type=Path, default=None, help="the model folder (default: the bench extra's)"
    )
    parser.add_argument("--redo", action="store_true", help="run the variants whose results are stored, too")
    parser.add_argument("--report", action="store_true", help="gather the stored results; run nothing")
    args = parser.parse_args(argv)
    args.out = ablation_folder(args.out, QUESTION)
    args.seeds = args.seeds or ([0] if args.quick else [0, 1, 2])
    if not args.report:
        for name in args.variants:
            if args.redo or stored(name, args) is None:
                run_variant(name, args)
    result = gather(args.variants, args)
    result["seeds"] = args.seeds
    return write_results(
        args.out, f"{NAME}_s{args.steps}" if args.steps else NAME, args.quick, result, table(result),
        notes=notes(result, args),
        plot=lambda path: plot(result, path),
    )  # fmt: skip


if __name__ == "__main__":
    main()
