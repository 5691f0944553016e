"""What ``finetune_code.py`` runs in its child processes: sentence-transformers' fine-tuning and mining, and a
list of the benchmark's command lines run one after another in one process.

A command line is what ``finetune_code.py`` starts in a process of its own with ``--process-per run``
(``python -m composer_dynsample train ...``, ``python _finetune_workers.py --st-worker SPEC``). With
``--process-per tool`` each tool's command lines run in one process instead (:func:`run_commands`): Composer
and sentence-transformers are imported once, where a process per run would pay the import every time (17.9 s
for Composer on the H200 of ``../shared/device/README.md``, more than a run's fit on a GPU). Each command's
seconds and, on CUDA, its peak of allocated GPU memory are written after it ends, and a line starting with
:data:`PROGRESS` is printed, which ``finetune_code.py`` echoes.

    python benchmarks/_finetune_workers.py --st-worker SPEC | --mine-worker SPEC | --commands FILE RECORDS
"""

from __future__ import annotations

import gc
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

#: The start of the lines a process of many runs prints as each run ends (the parent echoes them).
PROGRESS = "progress: "


def st_worker(spec: dict[str, Any]) -> None:
    """Fine-tune with sentence-transformers' trainer (in this process), save the model and its timing.

    ``spec`` holds ``model``, ``train`` (JSON Lines of ``anchor``, ``positive`` and maybe ``negative``),
    ``out``, ``seed``, ``steps``, ``batch``, ``lr``, ``max_length``, ``device`` (torch's name) and ``bf16``
    (the trainer's ``bf16`` autocast).
    """
    import datasets
    from sentence_transformers import SentenceTransformer, SentenceTransformerTrainer, losses
    from sentence_transformers.sentence_transformer.training_args import (
        BatchSamplers,
        SentenceTransformerTrainingArguments,
    )

    model = SentenceTransformer(spec["model"], device=spec["device"])
    model.max_seq_length = spec["max_length"]
    rows = [json.loads(line) for line in Path(spec["train"]).read_text().splitlines() if line.strip()]
    arguments = SentenceTransformerTrainingArguments(
        output_dir=str(Path(spec["out"]) / "trainer"), max_steps=spec["steps"], per_device_train_batch_size=spec["batch"],
        learning_rate=spec["lr"], warmup_steps=0.1, lr_scheduler_type="linear", weight_decay=0.01, seed=spec["seed"],
        batch_sampler=BatchSamplers.NO_DUPLICATES, save_strategy="no", report_to=[], logging_steps=10**9,
        disable_tqdm=True, use_cpu=spec["device"] == "cpu", dataloader_drop_last=True, bf16=spec["bf16"],
    )  # fmt: skip
    trainer = SentenceTransformerTrainer(
        model=model, args=arguments, train_dataset=datasets.Dataset.from_list(rows),
        loss=losses.MultipleNegativesRankingLoss(model),
    )  # fmt: skip
    start = time.perf_counter()
    trainer.train()
    seconds = time.perf_counter() - start
    model.save(spec["out"])
    timing = {"s_per_step": round(seconds / spec["steps"], 3), "fit_s": round(seconds, 1)}
    (Path(spec["out"]) / "timing.json").write_text(json.dumps(timing))


def mine_worker(spec: dict[str, Any]) -> None:
    """Mine one negative per query with the base model, as sentence-transformers documents, to JSON Lines.

    ``spec`` holds ``model``, ``train``, ``out``, ``max_length``, ``device`` and ``batch_size`` (texts per
    forward pass of the encode).
    """
    import datasets
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.util import mine_hard_negatives

    model = SentenceTransformer(spec["model"], device=spec["device"])
    model.max_seq_length = spec["max_length"]
    rows = [json.loads(line) for line in Path(spec["train"]).read_text().splitlines() if line.strip()]
    start = time.perf_counter()
    mined = mine_hard_negatives(
        datasets.Dataset.from_list(rows), model, range_min=0, range_max=50, relative_margin=0.05,
        num_negatives=1, batch_size=spec["batch_size"], verbose=False,
    )  # fmt: skip
    seconds = time.perf_counter() - start
    Path(spec["out"]).write_text("".join(json.dumps(row) + "\n" for row in mined))
    Path(spec["out"]).with_suffix(".timing.json").write_text(
        json.dumps({"mine_s": round(seconds, 1), "triplets": len(mined), "pairs": len(rows)})
    )


#: The workers a command line of this file names, by flag.
WORKERS: dict[str, Callable[[dict[str, Any]], None]] = {
    "--st-worker": st_worker,
    "--mine-worker": mine_worker,
}


def run_in_process(command: list[str]) -> None:
    """Do what ``command`` (a command line of ``finetune_code.py``, the interpreter first) does, in this process.

    Raises:
        ValueError: If ``command`` is neither ``python -m composer_dynsample ...`` nor one of this file's
            workers.
    """
    if command[1:3] == ["-m", "composer_dynsample"]:
        from composer_dynsample.cli.main import main

        main(command[3:])
    elif (
        len(command) == 4 and Path(command[1]).resolve() == Path(__file__).resolve() and command[2] in WORKERS
    ):
        WORKERS[command[2]](json.loads(command[3]))
    else:
        raise ValueError(
            f"command must run 'python -m composer_dynsample' or one of {sorted(WORKERS)} of {Path(__file__).name}, "
            f"got {command[1:4]}."
        )


def run_commands(commands_file: Path, records_file: Path) -> None:
    """Run the ``[{"name", "command"}, ...]`` of ``commands_file`` in turn in this process; after each, write
    ``{name: {"seconds", "peak_gpu_mib"}}`` so far to ``records_file`` (the GPU peak where CUDA was used) and
    print a :data:`PROGRESS` line."""
    import torch

    records: dict[str, dict[str, float]] = {}
    for job in json.loads(Path(commands_file).read_text()):
        if torch.cuda.is_initialized():
            torch.cuda.reset_peak_memory_stats()
        start = time.perf_counter()
        run_in_process(job["command"])
        if torch.cuda.is_initialized():
            torch.cuda.synchronize()
        record = {"seconds": round(time.perf_counter() - start, 1)}
        if torch.cuda.is_initialized():
            record["peak_gpu_mib"] = round(torch.cuda.max_memory_allocated() / 2**20)
        records[job["name"]] = record
        Path(records_file).write_text(json.dumps(records))
        print(f"{PROGRESS}{job['name']}: {record['seconds']:.1f} s", flush=True)
        gc.collect()  # the run's model and optimiser go before the next run's
        if torch.cuda.is_initialized():
            torch.cuda.empty_cache()


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] in WORKERS:
        WORKERS[sys.argv[1]](json.loads(sys.argv[2]))
    elif len(sys.argv) == 4 and sys.argv[1] == "--commands":
        run_commands(Path(sys.argv[2]), Path(sys.argv[3]))
    else:
        sys.exit(__doc__)
