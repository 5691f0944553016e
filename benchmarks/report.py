"""Regenerate the benchmark summary and tables from ``benchmarks/results/*.json``.

Every headline in the benchmark summary comes from a results file that a script in this folder wrote;
this script rewrites, in the project's README and in ``benchmarks/README.md``, the text between the
``<!-- benchmarks:start -->`` and ``<!-- benchmarks:end -->`` markers and every
``<!-- results:NAME -->`` ... ``<!-- /results:NAME -->`` block with ``benchmarks/results/NAME.md``, and
the figures of the mining method card (``composer_dynsample/algorithms/hard_negative_mining/README.md``,
between ``<!-- measured:start -->`` and ``<!-- measured:end -->``). ``make bench`` runs it last;
``--check`` fails when any of these files is stale.

    python benchmarks/report.py [--results benchmarks/results] [--readme README.md]
                                [--tables benchmarks/README.md] [--check]
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

START, END = "<!-- benchmarks:start -->", "<!-- benchmarks:end -->"

# (results name, what the headline ratio is, the goal as stated in the issues); the script that writes
# a results file is its name with .py, but for the glyph groups of quality_glyphs.py.
HEADLINES = [
    ("samplers", "1 s / one epoch of P x K (1M samples, 100k classes)", ">= 1 (under 1 s)"),
    ("miners", "PML BatchHardMiner time / our batch_hard at B = 1024", ">= 3"),
    ("overhead", "largest mining time / training step at B = 256, no memory", "<= 0.05"),
    ("quality", "default recipe's mean Recall@1 on MNIST-1D / 0.97", ">= 1"),
    ("quality_glyphs", "best / worst mining strategy's MAP@R, unseen glyphs", "report"),
    ("sampling_glyphs", "best / worst sampler's MAP@R, unseen glyphs", "report"),
    ("contrastive_glyphs", "best / worst InfoNCE or pool's MAP@R, unseen glyphs", "report"),
    ("antipattern", "anchors/s of this design / model in __getitem__ at B = 256", ">= 8"),
    ("dataloader", "index-only / per-sample loader samples/s, 0 workers, 200k x 128", "> 1"),
    ("miners_scaling", "worst miner / matmul time at B = 4096", "small constant"),
    ("chunking", "peak memory, chunks of 128 / unchunked step at B = 1024", "<= 0.25 (time <= 1.5x)"),
    ("threads", "slowest OMP_NUM_THREADS setting's fit time / 1 thread's", "report"),
    ("distributed", "2-rank / 1-rank samples/s, no cross-rank mining, 2 cores", "report"),
    ("quality_code", "best dense recipe's CodeSearchNet MRR / BM25's, unseen packages", ">= 1 (moonshot)"),
    ("text_loader", "code-search training step / DataLoader batch (0 workers, 256 x 2 rows)", ">= 10"),
    (
        "streaming",
        "s per step, pairs from warm-cache MDS shards / from the file, 0 DataLoader workers",
        "<= 1.05",
    ),
    (
        "corpus_negatives",
        "one whole refresh of mined corpus negatives at 1M pairs x 128, 2 threads / 60 s",
        "<= 1 (recall >= 0.9)",
    ),
    (
        "quality_mined",
        "best online hard-negative recipe's CSN MRR / in-batch InfoNCE's, same encoder",
        "> 1 beyond 2 SE",
    ),
    ("table", "embedding-table write / training step at B = 256, 100k rows, small 1-D CNN", "<= 0.02"),
    ("table_costs", "embedding-table write / training step, code search with mined negatives", "<= 0.02"),
    (
        "finetune_code",
        "online mined negatives' CSN MRR / in-batch InfoNCE's, fine-tuning all-MiniLM-L6-v2",
        "> 1 beyond 2 SE",
    ),
    (
        "ablations/finetune_recipe/finetune_code_ablation",
        "best online mined recipe's CSN MRR / best offline one's, each switch 3 seeds (60 steps)",
        "> 1 beyond 2 SE",
    ),
    ("startup", "train's imports (text recipe) / import torch, composer, transformers", "<= 1.5"),
    (
        "step_overhead",
        "fine-tuning recipe's step / a bare PyTorch loop's, null encoder (host overhead)",
        "<= 1.10, no host read between logs",
    ),
]
GLYPH_GROUPS = ("sampling_glyphs", "contrastive_glyphs")


def _script(name: str) -> str:
    if name.endswith("/finetune_code_ablation"):
        return "finetune_ablation.py"
    return "quality_glyphs.py" if name in GLYPH_GROUPS else f"{name}.py"


def _machine(result: dict) -> str:
    machine = result.get("machine")
    if machine is None and isinstance(result.get("config"), dict):
        machine = result["config"].get("machine")
    if isinstance(machine, dict):
        machine = ", ".join(f"{key} {value}" for key, value in machine.items())
    return str(machine or "not recorded")


def summary(results: Path) -> str:
    """The markdown summary table of every headline ratio found in ``results``."""
    lines = [
        "| benchmark | headline | ratio | goal | machine |",
        "|---|---|---:|---|---|",
    ]
    for name, meaning, goal in HEADLINES:
        script = _script(name)
        path = results / f"{name}.json"
        if not path.exists():
            lines.append(f"| `{script}` | {meaning} | not run | {goal} | |")
            continue
        result = json.loads(path.read_text())
        lines.append(
            f"| `{script}` | {meaning} | {float(result['ratio']):.3g} | {goal} | {_machine(result)} |"
        )
    lines.append("")
    lines.append("Full tables: `benchmarks/results/<name>.md`, plots: `benchmarks/results/<name>.png`.")
    return "\n".join(lines)


def fill_tables(text: str, results: Path) -> str:
    """Replace each ``<!-- results:NAME -->`` ... ``<!-- /results:NAME -->`` block with ``results/NAME.md``."""
    for match in reversed(
        list(re.finditer(r"<!-- results:([\w./-]+) -->\n(.*?)<!-- /results:\1 -->", text, re.S))
    ):
        table = (results / f"{match.group(1)}.md").read_text().strip()
        block = f"<!-- results:{match.group(1)} -->\n{table}\n<!-- /results:{match.group(1)} -->"
        text = text[: match.start()] + block + text[match.end() :]
    return text


CARD = Path(__file__).parent.parent / "composer_dynsample/algorithms/hard_negative_mining/README.md"
CARD_START, CARD_END = "<!-- measured:start -->", "<!-- measured:end -->"


def _goal(miners: dict, prefix: str) -> dict:
    return next(goal for goal in miners["goals"] if goal["goal"].startswith(prefix))


def method_card(results: Path) -> str:
    """The method card's "Measured" paragraph, from ``miners.json`` and ``overhead.json``."""
    miners = json.loads((results / "miners.json").read_text())
    overhead = json.loads((results / "overhead.json").read_text())
    batch_hard = _goal(miners, "batch_hard <= 3x matmul")["measured"]
    batch_hard_pml = _goal(miners, "batch_hard >= 3x faster than PML")["measured"]
    semi = _goal(miners, "semi_hard <= ")
    semi_goal = semi["goal"].split("<=", 1)[1].split("matmul")[0].strip()
    multi = _goal(miners, "multi_similarity faster than PML")["measured"]
    memory = next(row for row in miners["memory"] if row["batch"] == 1024)
    threads = miners["config"].get("threads", "?")
    return (
        f"`benchmarks/miners.py` and `benchmarks/overhead.py`, {threads} threads ({_machine(miners)}): "
        f"`batch_hard` {batch_hard} one `emb @ emb.T` matmul and {batch_hard_pml} faster than PML's "
        f"`BatchHardMiner` at B = 1024 with identical triplets; `multi_similarity` {multi} faster than PML's "
        f"with identical pairs; `semi_hard` {semi['measured']} the matmul (goal {semi_goal}, "
        f"{'met' if semi['met'] else 'missed'}) with {memory['semi_hard_peak_mib']:g} MiB at B = 1024 (PML's "
        f"all-triplet semihard miner: {memory['pml_semihard_peak_mib']:g} MiB); mining at most "
        f"{100 * float(overhead['ratio']):.1f}% of a training step of a small 1-D CNN at B = 256."
        + _objects_sentence(results)
    )


def _objects_sentence(results: Path) -> str:
    """From ``miner_objects.json``, when it was run: what the miner objects cost per call."""
    path = results / "miner_objects.json"
    if not path.exists():
        return ""
    goals = json.loads(path.read_text())["goals"]
    return (
        f" `benchmarks/miner_objects.py`: a miner object takes at most {goals[0]['measured'].split()[1]} the time "
        "of the same work with no object around it, over every miner at B >= 256."
    )


def fill_card(text: str, results: Path) -> str:
    """Replace the method card's text between the ``measured`` markers with :func:`method_card`."""
    head, rest = text.split(CARD_START, 1)
    _, tail = rest.split(CARD_END, 1)
    return f"{head}{CARD_START}\n{method_card(results)}\n{CARD_END}{tail}"


def fill_page(text: str, results: Path, path: Path) -> str:
    """``text`` with its summary markers and its results blocks refilled from ``results``."""
    if START not in text or END not in text:
        raise SystemExit(f"{path} has no {START} ... {END} markers to fill.")
    head, rest = text.split(START, 1)
    _, tail = rest.split(END, 1)
    return fill_tables(f"{head}{START}\n{summary(results)}\n{END}{tail}", results)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    root = Path(__file__).parent.parent
    parser.add_argument("--results", type=Path, default=Path(__file__).parent / "results")
    parser.add_argument("--readme", type=Path, default=root / "README.md")
    parser.add_argument("--tables", type=Path, default=Path(__file__).parent / "README.md")
    parser.add_argument("--card", type=Path, default=CARD, help="the mining method card to refill")
    parser.add_argument(
        "--check", action="store_true", help="exit 1 if a README or the card is not up to date"
    )
    args = parser.parse_args(argv)
    updates = []
    for path in (args.readme, args.tables):
        text = path.read_text()
        updates.append((path, text, fill_page(text, args.results, path)))
    card = args.card.read_text()
    updates.append((args.card, card, fill_card(card, args.results)))
    if args.check:
        stale = [str(path) for path, old, new in updates if old != new]
        if stale:
            print(
                f"not up to date with benchmarks/results: {', '.join(stale)}; run python benchmarks/report.py"
            )
        return 1 if stale else 0
    for path, _, new in updates:
        path.write_text(new)
    print(summary(args.results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
