"""Two data sets in one fine-tuning run: mixed (every batch from one source) against the same pairs merged
into one file (in-batch negatives across sources), each source's CSN MRR, and the cost of a mixed step.

The sources are two kinds of pairs built offline by ``benchmarks/_corpora.py`` from the installed packages:
``code`` (a docstring's first paragraph -> its function's code) and ``docstring`` (the first paragraph -> the
rest of the docstring, text to text). Each source gives half the training pairs (1,500 of the CPU size's
3,000) and its own test queries (500). Both recipes are ``yamls/finetune_code_search.yaml`` on
all-MiniLM-L6-v2 (the bench extra), 60 steps of 16 pairs, 3 seeds:

- ``mix``: ``data: {name: mix, sources: {code: ..., docstring: ...}, sampling: proportional}``: a batch
  holds one source's pairs; each source scored on its own test split (``metrics.json``'s ``sources``);
- ``merged``: ``data: {name: pairs}`` on the two training files concatenated: a batch mixes the sources, so
  a code query meets docstring bodies among its negatives; the run's checkpoint scored by ``eval`` on each
  source's test split.

The per-step cost is the training's wall time over its steps (``metrics.json``), the mix's against the
merged file's in the same invocation (goal: at most 1.05x).

    python benchmarks/finetune_mix.py [--seeds 0 1 2] [--quick]
"""

from __future__ import annotations

import json
import math
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import RESULTS, machine_info, markdown_table, trainer_overrides, write_results
from _common import parser as make_parser
from _corpora import prepare_data
from _pretrained import minilm_folder
from finetune_code import CONFIG, _cli, run_measured

NAME = "finetune_mix"
SOURCES = ("code", "docstring")
SIZE = {"pairs": 1500, "test_queries": 500, "steps": 60, "batch": 16, "max_length": 128, "eval_batch": 32}
QUICK = {"pairs": 48, "test_queries": 16, "steps": 4, "batch": 4, "max_length": 64, "eval_batch": 16}
METRIC = "csn_mrr"
GOAL = 1.05


def _pairs(path: str, max_length: int, cache: Path) -> dict[str, Any]:
    return {"name": "pairs", "path": path, "max_length": max_length, "cache_dir": str(cache)}


def _common(seed: int, model: Path, size: dict[str, Any]) -> list[str]:
    return [
        f"seed={seed}", f"model.encoder.path={model}", f"trainer.max_duration={size['steps']}ba",
        "trainer.progress_bar=false", f"evaluation.batch_size={size['eval_batch']}",
        f"evaluation.gallery_batch_size={size['eval_batch']}", "evaluation.at_start=false",
        f"sampler.classes_per_batch={size['batch']}", *trainer_overrides("cpu"),
    ]  # fmt: skip


def mix_data(data: dict[str, Any], size: dict[str, Any], cache: Path) -> dict[str, Any]:
    """The ``data`` section of the mixed run: each source its own training and test file."""
    sources = {
        name: {
            **_pairs(data[name]["train"]["path"], size["max_length"], cache / name),
            "test_path": data[name]["test"]["path"],
        }
        for name in SOURCES
    }
    return {"name": "mix", "sampling": "proportional", "sources": sources}


def merged_file(data: dict[str, Any], folder: Path) -> Path:
    """The sources' training pairs in one file, source after source (the sampler shuffles them)."""
    target = folder / "merged.jsonl"
    target.write_text("".join(Path(data[name]["train"]["path"]).read_text() for name in SOURCES))
    return target


def _section(value: dict[str, Any]) -> str:
    return json.dumps(value)  # a flow mapping OmegaConf reads as YAML


def run_seed(
    seed: int, model: Path, data: dict[str, Any], size: dict[str, Any], work: Path
) -> dict[str, Any]:
    """Both recipes of one seed: each source's metric and the seconds a step."""
    record: dict[str, Any] = {"seed": seed}
    mixed = work / f"mix-{seed}"
    section = mix_data(data, size, work / "cache")
    command = _cli("train", str(CONFIG), *_common(seed, model, size), f"data={_section(section)}",
                   "trainer.save_folder=null", "--run-dir", str(mixed))  # fmt: skip
    run_measured(command, 2, work / f"mix-{seed}.log")
    metrics = json.loads((mixed / "metrics.json").read_text())
    record["mix"] = {name: metrics["sources"][name][METRIC] for name in SOURCES}
    record["mix"]["s_per_step"] = metrics["wall_time_s"] / metrics["batches"]

    merged = work / f"merged-{seed}"
    first = SOURCES[0]
    train = {**_pairs(str(merged_file(data, work)), size["max_length"], work / "cache" / "merged"),
             "test_path": data[first]["test"]["path"]}  # fmt: skip
    command = _cli("train", str(CONFIG), *_common(seed, model, size), f"data={_section(train)}",
                   f"trainer.save_interval={size['steps']}ba", "--run-dir", str(merged))  # fmt: skip
    run_measured(command, 2, work / f"merged-{seed}.log")
    metrics = json.loads((merged / "metrics.json").read_text())
    record["merged"] = {first: metrics[METRIC], "s_per_step": metrics["wall_time_s"] / metrics["batches"]}
    for name in SOURCES[1:]:  # the same weights on the other source's test split
        scored = {**train, "test_path": data[name]["test"]["path"]}
        out = work / f"merged-{seed}-{name}.json"
        command = _cli("eval", "--run", str(merged), f"data={_section(scored)}", "--out", str(out))
        run_measured(command, 2, work / f"merged-{seed}-{name}.log")
        record["merged"][name] = json.loads(out.read_text())[METRIC]
    print(f"seed {seed}: {json.dumps({k: v for k, v in record.items() if k != 'seed'})}", flush=True)
    return record


def _mean_se(values: list[float]) -> tuple[float, float]:
    mean = sum(values) / len(values)
    if len(values) < 2:
        return mean, 0.0
    return mean, math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1) / len(values))


def summarise(records: list[dict[str, Any]]) -> tuple[dict[str, Any], str]:
    """Each recipe's mean +- SE per source and per step; the mix's difference from the merged file, and
    the ratio of their seconds a step."""
    summary: dict[str, Any] = {}
    rows = []
    for recipe in ("merged", "mix"):
        summary[recipe] = {
            key: _mean_se([r[recipe][key] for r in records]) for key in (*SOURCES, "s_per_step")
        }
        cells = [f"{summary[recipe][name][0]:.4f} +- {summary[recipe][name][1]:.4f}" for name in SOURCES]
        rows.append([recipe, *cells, f"{summary[recipe]['s_per_step'][0]:.3f}"])
    differences = []
    for name in SOURCES:
        (a, sa), (b, sb) = summary["mix"][name], summary["merged"][name]
        differences.append(f"{a - b:+.4f} +- {2 * math.hypot(sa, sb):.4f}")
    ratio = summary["mix"]["s_per_step"][0] / summary["merged"]["s_per_step"][0]
    rows.append(["mix - merged", *differences, f"{ratio:.3f}x"])
    summary["ratio"] = ratio
    summary["goal"] = {"name": "mixed step / merged step", "target": f"<= {GOAL}", "met": ratio <= GOAL}
    header = ("recipe", *(f"{name} CSN MRR" for name in SOURCES), "s / step")
    text = (
        f"Fine-tuning all-MiniLM-L6-v2 on two sources ({', '.join(SOURCES)}), {len(records)} seed(s); mean +- "
        "standard error over seeds, a difference +- two standard errors. `merged`: one file of both sources "
        "(a batch mixes them); `mix`: `data: {name: mix}` (a batch from one source). The last row's step "
        "cost is the mix's seconds a step over the merged file's.\n\n" + markdown_table(header, "lrrr", rows)
    )
    return summary, text


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = make_parser(__doc__, quick_help="a few steps of a few pairs, one seed: a smoke test")
    parser.add_argument("--seeds", nargs="+", type=int, default=None)
    parser.add_argument(
        "--model", type=Path, default=None, help="the starting folder (default: the bench extra's)"
    )
    args = parser.parse_args(argv)
    size, seeds = (QUICK if args.quick else SIZE), args.seeds or ([0] if args.quick else [0, 1, 2])
    model, started = args.model or minilm_folder(), time.time()
    with tempfile.TemporaryDirectory(prefix="dynsample-mix-") as scratch:
        work = Path(scratch)
        data = {}
        for name in SOURCES:
            (work / name).mkdir()
            data[name] = prepare_data(work / name, size["pairs"], size["test_queries"], args.quick, 0, name)
        records = [run_seed(seed, model, data, size, work) for seed in seeds]
    summary, text = summarise(records)
    corpora = {
        name: {"sha256": data[name]["corpus_sha256"], "train": data[name]["train"]["sha256"]}
        for name in SOURCES
    }
    result = {
        "runs": records, "summary": summary, "seeds": seeds, "size": size, "corpora": corpora,
        "machine": machine_info(), "total_s": round(time.time() - started, 1),
        "command": "python benchmarks/finetune_mix.py" + (" --quick" if args.quick else ""),
    }  # fmt: skip
    write_results(RESULTS, NAME, args.quick, result, text)
    print(text)
    return result


if __name__ == "__main__":
    main()
