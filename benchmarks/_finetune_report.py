"""What ``finetune_code.py`` reports: its recipes' names, their summary over seeds, the goals, the table and the plot.

The goals of ``--size cpu`` are the issue's: the mined recipes above in-batch beyond two standard errors, this
project's in-batch equal to sentence-transformers' within them, this project's mined-once recipe above
sentence-transformers' beyond them, and this project's in-batch step at most as
slow and as large (peak RSS) as sentence-transformers'. ``--size gpu`` keeps the first two and asks its
in-batch step for at most half sentence-transformers' time at the same precision (moonshot: 25 ms a step at
128 pairs x 128 tokens).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from _common import markdown_table, save_figure

METRICS = ("csn_mrr", "mrr@10", "recall@1", "recall@10", "ndcg@10")
HEADERS = ("CSN MRR", "MRR@10", "Recall@1", "Recall@10", "nDCG@10")
ZERO_SHOT, BM25 = "zero-shot (all-MiniLM-L6-v2)", "BM25 (bm25s, identifier tokens)"
ST_IN_BATCH, ST_MINED = "sentence-transformers, in-batch (MNRL)", "sentence-transformers, mined once (MNRL)"
OURS_IN_BATCH = "this project, in-batch (InfoNCE)"
OURS_OFFLINE = "this project, mined once from the warm table"
OURS_ONLINE = "this project, mined online (warm table, refreshed)"
TRAINED = (ST_IN_BATCH, ST_MINED, OURS_IN_BATCH, OURS_OFFLINE, OURS_ONLINE)
#: The GPU size's goals for this project's in-batch step: a ratio to sentence-transformers', and seconds.
GPU_STEP_RATIO, GPU_STEP_MOONSHOT_S = 0.5, 0.025
#: The metrics recorded at each Matryoshka dimension (``metrics.json``'s ``matryoshka``), when evaluated.
DIM_METRICS = ("csn_mrr", "mrr@10")


def scores(metrics: Mapping[str, Any]) -> dict[str, Any]:
    """A run's :data:`METRICS` from its ``metrics.json`` (or ``eval`` json), and under ``dims`` the
    :data:`DIM_METRICS` at each Matryoshka dimension when it was evaluated at some
    (``model.loss.matryoshka_dims`` or ``evaluation.matryoshka_dims``)."""
    found: dict[str, Any] = {name: metrics[name.replace("@", "_at_")] for name in METRICS}
    per_dim = metrics.get("matryoshka") or {}
    if per_dim:
        found["dims"] = {
            dim: {name: values[name.replace("@", "_at_")] for name in DIM_METRICS}
            for dim, values in per_dim.items()
        }
    return found


def dims_line(run: Mapping[str, Any]) -> str:
    """A run's CSN MRR at each Matryoshka dimension for its progress line (``", at 64: 0.8318"``), or ``""``."""
    return "".join(f", at {dim}: {values['csn_mrr']:.4f}" for dim, values in run.get("dims", {}).items())


def _mean_se(values: list[float]) -> tuple[float, float]:
    """The mean of ``values`` and its standard error (0 for one value)."""
    se = statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else 0.0
    return statistics.fmean(values), se


def summarise(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The mean and standard error of each metric over the runs (seeds), at each Matryoshka dimension every
    run has too (``dims``), and the mean of their costs."""
    out: dict[str, Any] = {"runs": runs}
    for metric in METRICS:
        out[metric], out[f"{metric}_se"] = _mean_se([run[metric] for run in runs])
    dims = [dim for dim in runs[0].get("dims") or {} if all(dim in (run.get("dims") or {}) for run in runs)]
    if dims:
        out["dims"] = {}
        for dim in dims:
            out["dims"][dim] = {}
            for metric in DIM_METRICS:
                mean, se = _mean_se([run["dims"][dim][metric] for run in runs])
                out["dims"][dim].update({metric: mean, f"{metric}_se": se})
    for key in ("s_per_step", "peak_rss_mib", "peak_gpu_mib", "once_s"):
        if all(key in run for run in runs):
            out[key] = statistics.fmean(run[key] for run in runs)
    mined = [run["mining"] for run in runs if run.get("mining") and run["mining"]["snapshots"]]
    if mined and len(mined) == len(
        runs
    ):  # the first and the last snapshot's share, and the drift, over seeds
        out["above_positive_first"] = statistics.fmean(m["above_positive"][0] or 0.0 for m in mined)
        out["above_positive_last"] = statistics.fmean(m["above_positive"][-1] or 0.0 for m in mined)
        drifts = [m["fresh_drift"] for m in mined if m["fresh_drift"] is not None]
        if drifts:
            out["fresh_drift"] = statistics.fmean(drifts)
        checks = [m.get("list_drift") or [] for m in mined]
        if checks[0] and all(len(c) == len(checks[0]) for c in checks):  # the same snapshots in every seed
            out["list_drift"] = [
                {key: statistics.fmean(c[i][key] for c in checks) for key in LIST_DRIFT}
                for i in range(len(checks[0]))
            ]
    return out


#: What a run's ``list_drift`` checks keep, per snapshot (``EmbeddingTable(list_drift=True)``).
LIST_DRIFT = ("step", "overlap_table", "top1_table", "overlap_first", "top1_first", "seconds")


def mining_record(metrics: Mapping[str, Any]) -> dict[str, Any] | None:
    """What a mined run's embedding table and sampler recorded (``metrics.json``'s ``embedding_table``), for
    the false-negative and drift columns: ``snapshots`` searched, each one's share of kept candidates at least
    as similar to their anchor as its positive (``above_positive``, the likeliest unlabelled answers), the
    duplicates and other answers the guards dropped over all snapshots, the rows the table encoded beyond the
    forward passes (the warm start's included) and how far the fresh encodings moved from the rows they
    replaced (``fresh_drift``: one minus the mean cosine). ``None`` for a run without a table."""
    records = metrics.get("embedding_table") or []
    if not records:
        return None
    snapshots = [entry for record in records for entry in (record.get("sampler") or {}).get("snapshots", [])]
    measured = sum(record.get("fresh_rows_measured", 0.0) for record in records)
    drift = sum(record.get("fresh_rows_measured", 0.0) * record.get("fresh_drift", 0.0) for record in records)
    return {
        "snapshots": len(snapshots),
        "above_positive": [
            round(s["above_positive"] / s["kept"], 4) if s["kept"] else None for s in snapshots
        ],
        **{name: int(sum(s[name] for s in snapshots)) for name in ("duplicate", "same_query", "margin")},
        "rows_encoded": int(sum(record.get("rows_encoded", 0) for record in records)),
        "fresh_drift": round(drift / measured, 5) if measured else None,
        "list_drift": [
            {key: check[key] for key in LIST_DRIFT if key in check}
            for record in records
            for check in record.get("list_drift", [])
        ],
    }


def _difference(
    first: dict[str, Any], second: dict[str, Any], metric: str = "csn_mrr"
) -> tuple[float, float]:
    """``(mean of first - mean of second, two standard errors of that difference)``."""
    return first[metric] - second[metric], 2 * math.hypot(first[f"{metric}_se"], second[f"{metric}_se"])


def _verdict(met: bool) -> str:
    return "met" if met else "missed"


def _step_goal(ours: dict[str, Any], theirs: dict[str, Any], options: Mapping[str, Any]) -> str:
    """The goal on this project's in-batch step against sentence-transformers' (time, and on the CPU memory)."""
    time_ratio = ours["s_per_step"] / theirs["s_per_step"]
    if options.get("size") == "gpu":
        precision = {"bf16": "bf16 autocast", "fp32": "float32"}.get(
            options.get("precision"), "the same precision"
        )
        tokens = f"{options.get('batch', 128)} pairs x {options.get('max_length', 128)} tokens"
        return (
            f"In-batch step, this project / sentence-transformers, both in {precision}: {time_ratio:.2f}x the time "
            f"(goal <= {GPU_STEP_RATIO}x: {_verdict(time_ratio <= GPU_STEP_RATIO)}); this project's step "
            f"{1000 * ours['s_per_step']:.0f} ms at {tokens} (moonshot <= {1000 * GPU_STEP_MOONSHOT_S:.0f} ms: "
            f"{_verdict(ours['s_per_step'] <= GPU_STEP_MOONSHOT_S)})."
        )
    if (
        "peak_rss_mib" not in ours or "peak_rss_mib" not in theirs
    ):  # a process for many runs: no run's own RSS
        return (
            f"In-batch step, this project / sentence-transformers: {time_ratio:.2f}x the time "
            f"(goal <= 1.0x: {_verdict(time_ratio <= 1)})."
        )
    rss_ratio = ours["peak_rss_mib"] / theirs["peak_rss_mib"]
    return (
        f"In-batch step, this project / sentence-transformers: {time_ratio:.2f}x the time, {rss_ratio:.2f}x the "
        f"peak RSS (goal <= 1.0x both: {_verdict(max(time_ratio, rss_ratio) <= 1)})."
    )


def goals(recipes: dict[str, dict[str, Any]], options: Mapping[str, Any] | None = None) -> list[str]:
    """The issue's goals, each a sentence with its figures and whether it is met (differences in CSN MRR);
    ``options`` (the run's, with ``size``) chooses the step's goal. Default: the CPU size's."""
    lines = []
    if ZERO_SHOT in recipes:
        behind = [
            name
            for name in TRAINED
            if name in recipes and recipes[name]["csn_mrr"] <= recipes[ZERO_SHOT]["csn_mrr"]
        ]
        lines.append(
            "Every fine-tuned recipe beats zero-shot: "
            + ("met." if not behind else f"missed by {', '.join(behind)}.")
        )
    pairs = [
        (OURS_OFFLINE, OURS_IN_BATCH, "> 2 SE"), (OURS_ONLINE, OURS_IN_BATCH, "> 2 SE"),
        (ST_MINED, ST_IN_BATCH, "> 2 SE"), (OURS_ONLINE, OURS_OFFLINE, "> 2 SE"),
        (OURS_IN_BATCH, ST_IN_BATCH, "within 2 SE"), (OURS_OFFLINE, ST_MINED, "> 2 SE"),
    ]  # fmt: skip
    for first, second, goal in pairs:
        if first in recipes and second in recipes:
            gap, two_se = _difference(recipes[first], recipes[second])
            if min(len(recipes[first]["runs"]), len(recipes[second]["runs"])) < 2:
                lines.append(
                    f"{first} - {second}: {gap:+.4f}; goal {goal}: not judged (one seed, no standard error)."
                )
                continue
            met = abs(gap) <= two_se if goal == "within 2 SE" else gap > two_se
            lines.append(f"{first} - {second}: {gap:+.4f} (2 SE {two_se:.4f}); goal {goal}: {_verdict(met)}.")
    ours, theirs = recipes.get(OURS_IN_BATCH), recipes.get(ST_IN_BATCH)
    if ours and theirs and "s_per_step" in ours and "s_per_step" in theirs:
        lines.append(_step_goal(ours, theirs, options or {}))
    return lines


def headline_ratio(recipes: dict[str, dict[str, Any]]) -> float | None:
    """The online recipe's CSN MRR over this project's in-batch recipe's."""
    if OURS_ONLINE in recipes and OURS_IN_BATCH in recipes:
        return recipes[OURS_ONLINE]["csn_mrr"] / recipes[OURS_IN_BATCH]["csn_mrr"]
    return None


def _setting(options: Mapping[str, Any]) -> str:
    """The device and precision of a run that records them (the stored CPU tables do not: float32 on the CPU)."""
    if "precision" not in options:
        return ""
    device = (options.get("gpu") or "CUDA") if options.get("device") == "cuda" else "the CPU"
    if options["precision"] == "bf16":
        return f", bf16 autocast on {device}"
    fallback = (
        " (the GPU size's bf16 is for CUDA)" if options.get("size") == "gpu" and device == "the CPU" else ""
    )
    return f", float32 on {device}{fallback}"


def table(recipes: dict[str, dict[str, Any]], seeds: list[int], options: Mapping[str, Any]) -> str:
    """The markdown table of the recipes, its caption (the run's setting) and the goals below it."""
    memory = (
        "peak_gpu_mib" if any("peak_gpu_mib" in result for result in recipes.values()) else "peak_rss_mib"
    )
    rows = []
    for name, result in recipes.items():
        cells = [
            f"{result[m]:.4f} +- {result[m + '_se']:.4f}" if len(result["runs"]) > 1 else f"{result[m]:.4f}"
            for m in METRICS
        ]
        step = f"{result['s_per_step']:.2f}" if "s_per_step" in result else "-"
        peak = f"{result[memory]:.0f}" if memory in result else "-"
        once = f"{result['once_s']:.0f}" if "once_s" in result else "-"
        rows.append([name, *cells, step, once, peak])
    header = [
        "recipe",
        *HEADERS,
        "s/step",
        "mining s",
        "peak GPU MiB" if memory == "peak_gpu_mib" else "peak RSS MiB",
    ]
    text = markdown_table(header, "lrrrrrrrr", rows)
    epoch = f" ({_epochs(options)})" if options.get("size") == "gpu" else ""
    return (
        f"Fine-tuning all-MiniLM-L6-v2 on code search (unseen packages): {options['train_pairs']} training "
        f"pairs, {options['steps']} steps of {options['batch']} pairs{epoch}, {options['test_queries']} test "
        f"queries, max_length {options['max_length']}, {options['threads']} threads{_setting(options)}, "
        f"{len(seeds)} seed(s), mean +- standard error{_overridden(options)}.\n\n{text}\n\n"
        + "\n".join(f"- {line}" for line in goals(recipes, options))
        + dims_table(recipes)
    )


def _epochs(options: Mapping[str, Any]) -> str:
    """How many passes over the training pairs the run's steps make: ``one epoch`` or ``1.9 epochs``.

    Example:
        >>> _epochs({"steps": 321, "batch": 128, "train_pairs": 41117}), _epochs({"steps": 609, "batch": 128, "train_pairs": 41117})
        ('one epoch', '1.9 epochs')
    """
    per_epoch = options["train_pairs"] // options["batch"]  # one_epoch's steps
    if options["steps"] == per_epoch:
        return "one epoch"
    return f"{options['steps'] * options['batch'] / options['train_pairs']:.1f} epochs"


def _cell(result: Mapping[str, Any], metric: str, runs: int) -> str:
    return f"{result[metric]:.4f} +- {result[metric + '_se']:.4f}" if runs > 1 else f"{result[metric]:.4f}"


def dims_table(recipes: dict[str, dict[str, Any]]) -> str:
    """The recipes evaluated at Matryoshka dimensions: CSN MRR and MRR@10 at the full width and at each
    dimension (the first d dimensions, L2-normalised again); ``""`` when none was."""
    dims = sorted(
        {dim for result in recipes.values() for dim in result.get("dims", {})}, key=int, reverse=True
    )
    if not dims:
        return ""
    rows = []
    for name, result in recipes.items():
        if result.get("dims"):
            at = [result, *(result["dims"].get(dim) for dim in dims)]
            runs = len(result["runs"])
            rows.append([name, *(_cell(r, m, runs) if r else "-" for m in DIM_METRICS for r in at)])
    header = [
        "recipe",
        *(f"{label} at {dim}" for label in ("CSN MRR", "MRR@10") for dim in ("full", *dims)),
    ]
    text = markdown_table(header, "l" + "r" * (len(header) - 1), rows)
    return f"\n\nAt each Matryoshka dimension (the first d dimensions of the embedding, L2-normalised again):\n\n{text}"


def _overridden(options: Mapping[str, Any]) -> str:
    """The caption's words for ``--override``: what this project's runs were given beyond their recipe."""
    overrides = options.get("override") or []
    return f"; this project's runs with {', '.join(f'`{item}`' for item in overrides)}" if overrides else ""


def plot(recipes: dict[str, dict[str, Any]], path: Path) -> None:
    """The dense recipes' CSN MRR, mean +- 2 SE and each seed, on an axis that shows their differences;
    BM25, far below, is named in the title."""
    from matplotlib.figure import Figure

    names = [name for name in recipes if name != BM25]
    figure = Figure(figsize=(8, 0.6 * len(names) + 1.8))
    ax = figure.subplots()
    means = [recipes[n]["csn_mrr"] for n in names]
    errors = [2 * recipes[n]["csn_mrr_se"] for n in names]
    ax.errorbar(means, range(len(names)), xerr=errors, fmt="o", color="tab:blue", capsize=4)
    for row, name in enumerate(names):
        ax.plot([r["csn_mrr"] for r in recipes[name]["runs"]], [row] * len(recipes[name]["runs"]), "k.", ms=4)
    ax.set_yticks(range(len(names)), names, fontsize=8)
    ax.set_xlabel("CodeSearchNet MRR (unseen packages)")
    ax.grid(axis="x", alpha=0.3)
    bm25 = f"; BM25 {recipes[BM25]['csn_mrr']:.3f}" if BM25 in recipes else ""
    ax.set_title(f"fine-tuning all-MiniLM-L6-v2: mean +- 2 SE over seeds, dots = seeds{bm25}", fontsize=9)
    save_figure(figure, path)
